"""What a provider adapter answers for one attempt (docs/design.md, "Adapters").

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
    # The provider refused our session, not this message: its greeting or our HELO name,
    # TLS (a certificate we do not trust), AUTH, "authentication required". No message
    # gets through until an operator fixes the settings, so this is a fault of the
    # provider's configuration (reason ``provider_misconfigured``), never a rejection of
    # the message, and what a per-provider circuit breaker opens on.
    misconfigured: bool = False
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


def refused_recipients(response: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The recipients an answer names as refused, ``[{recipient, code, reply}]``, in order.

    An adapter puts them in its response as ``refused: {recipient: {code, reply}}``; on an
    accepted answer they are a partial refusal: the message went to everyone else."""
    refused = (response or {}).get("refused") or {}
    if not isinstance(refused, dict):
        return []
    out = []
    for recipient, answer in refused.items():
        answer = answer if isinstance(answer, dict) else {}
        out.append({"recipient": str(recipient), "code": answer.get("code"), "reply": str(answer.get("reply") or "")})
    return out


def log_fields(step: int, attempt: int, outcome: Outcome, **extra: Any) -> dict[str, Any]:
    """What every adapter logs about one attempt's outcome (never the request itself)."""
    r = outcome.response
    return dict(
        step=step, attempt=attempt, outcome=outcome.kind, code=r.get("code"), error_class=r.get("error_class"), **extra
    )
