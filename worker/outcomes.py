"""What a provider adapter answers for one attempt (DESIGN.md, "Adapters").

Exactly one of these per attempt. The adapter decides which, because only it
knows where in its protocol the failure happened; the core then decides the
step's next state from it (worker/transitions.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias


@dataclass(frozen=True, slots=True)
class Accepted:
    provider_message_id: str | None
    response: dict[str, Any] = field(default_factory=dict)
    kind: Literal["accepted"] = "accepted"


@dataclass(frozen=True, slots=True)
class Rejected:
    reason: str
    response: dict[str, Any] = field(default_factory=dict)
    # True when our own re-check refused the request before it was sent (policy), so
    # the evidence can say the provider never saw it.
    before_send: bool = False
    kind: Literal["rejected"] = "rejected"


@dataclass(frozen=True, slots=True)
class Retryable:
    """Failed before the provider could have acted on the request."""

    reason: str
    retry_after: float | None = None
    response: dict[str, Any] = field(default_factory=dict)
    # The provider said we send too fast (an HTTP 429): not this message's problem, so the
    # whole provider slows down for every worker (worker/ratelimit.py), not only this step.
    throttled: bool = False
    # A fault of the provider or of our settings, not of this message (worker/circuit.py
    # names them: connection_refused, tls_failed, auth_failed, ...): every message would
    # fail the same way, so it opens the provider's circuit and costs the message nothing.
    fault: str | None = None
    kind: Literal["retryable"] = "retryable"


@dataclass(frozen=True, slots=True)
class Unknown:
    """The provider may have acted: the request could have been accepted and the answer lost."""

    reason: str
    response: dict[str, Any] = field(default_factory=dict)
    kind: Literal["unknown"] = "unknown"


Outcome: TypeAlias = Accepted | Rejected | Retryable | Unknown


def log_fields(step: int, attempt: int, outcome: Outcome, **extra: Any) -> dict[str, Any]:
    """What every adapter logs about one attempt's outcome (never the request itself)."""
    r = outcome.response
    return dict(step=step, attempt=attempt, outcome=outcome.kind, code=r.get("code"),
                error_class=r.get("error_class"), **extra)
