"""Per-provider circuit breaker: an outage is not a refusal (issue 12, invariant 10).

When a provider is down or misconfigured (connection refused, a certificate that does
not verify, a wrong password, "must issue STARTTLS", HTTP 401/403) every message sent
to it fails the same way. Without a breaker each of them burns its attempts against the
wall and ends ``rejected``; with it the provider's circuit opens, no worker claims its
steps, the attempts that hit the fault are not charged to their messages, and one step
at a time is let through as a probe, with exponential backoff, until one succeeds.

The state lives in PostgreSQL (``provider_circuits``, one row per provider, and the
append-only ``provider_circuit_events``), so every worker on every host sees it: the
claim statement skips the steps of a provider whose circuit is not closed. This module
holds the rules, pure so they are tested without I/O; the worker applies them
(worker/runner.py) and the store writes them (adapters/postgres/queries.sql).

- A provider-level fault (``Retryable.fault``, set by the adapter, named in
  :data:`FAULTS`) opens the circuit at once when ``EVQ_CIRCUIT_FAULTS`` names it, and
  the attempt is not charged (``uncharged_attempts``).
- ``EVQ_CIRCUIT_FAILURES`` consecutive temporary failures seen by one worker (a 4yz,
  a timeout, a reset: not a 429, which the rate limit handles) open it too; the
  failure that opens it, and every later one while it is open, is not charged.
  Counted per worker so a send costs no extra statement while all is well.
- Open: after ``probe_delay(probes)`` (``EVQ_CIRCUIT_PROBE_BASE`` doubling per failed
  probe, at most ``EVQ_CIRCUIT_PROBE_MAX``) one worker takes the probe (half-open) and
  sends one step; a provider answer (accepted, or a refusal of that message) closes
  the circuit, any other outcome opens it again with the next, longer delay.
- Any accepted send closes a circuit this worker believes is not closed (a send that
  was in flight when it opened got through: the provider is back).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from evq.worker.outcomes import Outcome, Rejected, Retryable

# The provider-level faults adapters report (worker/outcomes.py, Retryable.fault).
FAULTS: tuple[str, ...] = (
    "connection_refused",  # nothing listens: the server or the route is down
    "tls_failed",  # the handshake failed or the certificate does not verify
    "auth_failed",  # SMTP 535 / HTTP 401: the credentials are wrong
    "forbidden",  # HTTP 403: the key may not send
    "starttls_required",  # SMTP 530: the server wants TLS our settings do not use
    "greeting_refused",  # the SMTP server refused the session at its greeting
)
# Why a circuit opened when no single fault said so.
CONSECUTIVE_FAILURES = "consecutive_failures"
PROBE_INCONCLUSIVE = "probe_inconclusive"  # the probe's answer was lost: not proof the provider works


class CircuitState(StrEnum):
    CLOSED = "closed"
    HALF_OPEN = "half_open"
    OPEN = "open"


# evq_provider_circuit_state's values: ordered by how much is held back.
STATE_VALUES: dict[CircuitState, int] = {CircuitState.CLOSED: 0, CircuitState.HALF_OPEN: 1, CircuitState.OPEN: 2}


def circuit_faults(value: str) -> frozenset[str]:
    """``EVQ_CIRCUIT_FAULTS``: comma-separated fault names, ``all`` or ``none``."""
    text = value.strip().lower()
    if text == "all":
        return frozenset(FAULTS)
    if text in ("none", ""):
        return frozenset()
    names = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(FAULTS))
    if unknown:
        raise ValueError(f"unknown fault {', '.join(unknown)}; known: {', '.join(FAULTS)} (or all, none)")
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class CircuitConfig:
    faults: frozenset[str] = frozenset(FAULTS)
    failures: int = 10  # consecutive temporary failures that open a circuit (0: only faults do)
    probe_base: float = 10.0
    probe_max: float = 600.0

    def probe_delay(self, probes: int) -> float:
        """Seconds from an opening (probes=0) or the n-th failed probe to the next probe."""
        exponent = min(max(probes, 0), 60)  # 2**60 s is past any maximum; keeps it a float
        return min(self.probe_max, self.probe_base * math.pow(2.0, exponent))


@dataclass(frozen=True, slots=True)
class Trip:
    """Open (or reopen) the provider's circuit."""

    reason: str  # a fault name, or CONSECUTIVE_FAILURES
    detail: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one outcome means for the provider's circuit and for the message."""

    charged: bool = True  # the attempt counts against the message's attempts
    trip: Trip | None = None
    close: bool = False


# The verdicts of nearly every send, made once (they are frozen): an accepted send's.
_NOTHING = Verdict()
_CLOSE = Verdict(close=True)


@dataclass
class _Provider:
    state: CircuitState = CircuitState.CLOSED
    consecutive: int = 0


@dataclass
class CircuitBook:
    """One worker's view of its providers' circuits: what it saw, what the database said."""

    config: CircuitConfig
    _providers: dict[str, _Provider] = field(default_factory=dict)

    def state(self, provider: str) -> CircuitState:
        return self._get(provider).state

    def _get(self, provider: str) -> _Provider:
        # A lookup first: setdefault would build a _Provider on every call (every send).
        p = self._providers.get(provider)
        if p is None:
            p = self._providers[provider] = _Provider()
        return p

    def learn(self, states: Iterable[tuple[str, CircuitState]]) -> None:
        """What the database says now (every provider not named is closed)."""
        named = dict(states)
        for provider, p in self._providers.items():
            if provider not in named:
                p.state = CircuitState.CLOSED
        for provider, state in named.items():
            self._get(provider).state = state

    @property
    def any_held(self) -> bool:
        return any(p.state is not CircuitState.CLOSED for p in self._providers.values())

    def observe(self, provider: str, outcome: Outcome, *, probe: bool = False) -> Verdict:
        """The outcome of one attempt; updates this worker's view and says what to do."""
        p = self._get(provider)
        if isinstance(outcome, Retryable) and outcome.throttled:
            # Too fast is the rate limit's business (worker/ratelimit.py), not an outage.
            return _NOTHING
        if outcome.kind == "accepted" or (isinstance(outcome, Rejected) and not outcome.before_send):
            # The provider answered about this message: it is up and our settings work.
            p.consecutive = 0
            if probe or p.state is not CircuitState.CLOSED:
                p.state = CircuitState.CLOSED
                return _CLOSE
            return _NOTHING
        if not isinstance(outcome, Retryable):
            # Unknown (the provider may have acted) says nothing for sure; a policy refusal
            # never reached it. A probe that ends so has not shown the provider works.
            if probe:
                p.state = CircuitState.OPEN
                return Verdict(trip=Trip(PROBE_INCONCLUSIVE, _reason(outcome)))
            return Verdict()
        if outcome.response.get("error_class") == "LeaseTooShort":
            # Our own fence stopped it (a paused worker): nothing about the provider.
            return Verdict()
        p.consecutive += 1
        fault = outcome.fault if outcome.fault in self.config.faults else None
        held = p.state is not CircuitState.CLOSED
        counted_out = self.config.failures > 0 and p.consecutive >= self.config.failures
        if fault is not None or counted_out or probe or held:
            reason = fault or (outcome.fault if held and outcome.fault else CONSECUTIVE_FAILURES)
            trip = None
            if p.state is CircuitState.CLOSED or probe:
                trip = Trip(reason, _reason(outcome))
            p.state = CircuitState.OPEN
            return Verdict(charged=False, trip=trip)
        return Verdict()


def _reason(outcome: Outcome) -> str:
    return str(getattr(outcome, "reason", outcome.kind))[:500]
