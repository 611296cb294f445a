"""Sends that all fail the same way, said once and loudly (issue 18, "the first hour").

A worker pointed at nothing (the default ``localhost:25`` with the dev sink on 2525), or
with a wrong password, fails every send with the same cause. Each failure is already a row
and an info line; what a person needs is one warning that names the cause and the setting
to change, once per streak rather than once per send, and a drain summary that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evq.worker.outcomes import Outcome, Rejected, Retryable

# Consecutive attempts of one provider failing with one cause before the warning; a
# provider fault (nothing listens, TLS, AUTH: worker/circuit.py) is certain at the first.
WARN_AFTER = 3


@dataclass
class Streak:
    provider: str
    cause: str  # the fault name or the failure's reason key
    detail: str  # the adapter's words for the last failure
    attempts: int = 0
    warned: bool = False
    hint: str | None = None

    def fields(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "cause": self.cause,
            "detail": self.detail,
            "attempts": self.attempts,
            "hint": self.hint,
        }


@dataclass
class FailureStreaks:
    """Per provider: the run of consecutive failed attempts with one cause."""

    hints: Callable[[str, str], str | None] = lambda _provider, _cause: None
    _streaks: dict[str, Streak] = field(default_factory=dict)
    # Attempts the provider answered about their message (accepted, refused, maybe taken),
    # and attempts that failed before it could (not the 429s: those are pacing).
    answered: int = 0
    failed: int = 0

    @property
    def all_failed(self) -> bool:
        """Every attempt failed before any provider could act on it: nothing went anywhere."""
        return self.failed > 0 and self.answered == 0

    def observe(self, provider: str, outcome: Outcome) -> Streak | None:
        """Count one attempt; the streak to warn about now (once per streak), if any."""
        if isinstance(outcome, Retryable) and outcome.throttled:
            return None  # a 429 is the rate limit's business (worker/ratelimit.py)
        if not isinstance(outcome, Retryable):
            self.answered += 1
        else:
            self.failed += 1
        if outcome.kind == "accepted":
            self._streaks.pop(provider, None)
            return None
        if not isinstance(outcome, (Retryable, Rejected)):
            return None  # unknown: it may have been delivered
        fault = outcome.fault if isinstance(outcome, Retryable) else None
        cause = fault or str(outcome.response.get("error_class") or outcome.reason)[:80]
        detail = str(outcome.reason)[:300]
        streak = self._streaks.get(provider)
        if streak is None or streak.cause != cause:
            streak = self._streaks[provider] = Streak(provider, cause, detail, hint=self.hints(provider, cause))
        streak.attempts += 1
        streak.detail = detail
        if not streak.warned and (fault is not None or streak.attempts >= WARN_AFTER):
            streak.warned = True
            return streak
        return None

    def ongoing(self) -> list[Streak]:
        return [self._streaks[p] for p in sorted(self._streaks)]


def message(streak: Streak) -> str:
    """One line for people: the cause, then what to change."""
    text = (
        f"every send through {streak.provider} in the last {streak.attempts} attempt"
        f"{'s' if streak.attempts != 1 else ''} failed: {streak.detail}"
    )
    return f"{text} — {streak.hint}" if streak.hint else text
