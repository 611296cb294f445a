"""From one attempt's outcome to the step's next state: pure, so it is tested without I/O.

The rules (docs/design.md, "States and transitions", and invariant 4):
- Accepted -> accepted; Rejected -> rejected.
- Retryable -> retryable after a backoff, or rejected once attempts are spent.
- A step that an earlier attempt may have delivered never ends ``rejected``: a
  rejection tells the sender (and its failure notice) that it did not go out. Spent
  attempts, and a refusal of a later attempt (the policy re-check, a provider that
  no longer knows the key), end ``unknown`` instead.
- Unknown -> unknown; unless the provider dedupes our key and its window is still
  open, then retryable (the next attempt reuses the key, the provider sends once).
"""

from __future__ import annotations

from worker.backoff import Backoff
from worker.outcomes import Accepted, Outcome, Rejected, Retryable, Unknown, refused_recipients
from worker.records import ClaimedStep, Transition
from worker.states import Reason, Status


def decide(
    step: ClaimedStep,
    outcome: Outcome,
    *,
    default_max_attempts: int,
    backoff: Backoff,
    dedupe_window_open: bool,
    latency_ms: float | None = None,
) -> Transition:
    max_attempts = step.max_attempts or default_max_attempts
    attempts_left = step.attempt < max_attempts
    common = dict(
        step_id=step.id,
        lease_token=step.lease_token,
        attempt=step.attempt,
        outcome=outcome.kind,
        latency_ms=latency_ms,
        maybe_delivered=step.maybe_delivered,
    )
    detail = dict(outcome.response)
    match outcome:
        case Accepted(provider_message_id=pmid):
            refused = refused_recipients(detail)
            if refused:
                detail["message"] = "accepted, but refused for " + "; ".join(
                    f"{r['recipient']} ({r['code']} {r['reply']})".rstrip() for r in refused
                )
            return Transition(
                to_status=Status.ACCEPTED,
                reason=Reason.PARTIALLY_REFUSED if refused else Reason.PROVIDER_ACCEPTED,
                provider_message_id=pmid,
                detail=detail,
                **common,
            )
        case Rejected(reason=why, before_send=before_send):
            detail["message"] = why
            reason = Reason.POLICY_REFUSED if before_send else Reason.PROVIDER_REJECTED
            if step.maybe_delivered:
                detail["message"] = f"{why}; but an earlier attempt may have been delivered"
                return Transition(to_status=Status.UNKNOWN, reason=reason, detail=detail, **common)
            return Transition(to_status=Status.REJECTED, reason=reason, detail=detail, **common)
        case Retryable(reason=why, retry_after=retry_after, misconfigured=misconfigured):
            detail["message"] = why
            if attempts_left:
                delay = backoff.delay(step.attempt)
                if retry_after is not None:
                    delay = max(delay, retry_after)
                return Transition(
                    to_status=Status.RETRYABLE,
                    reason=Reason.PROVIDER_MISCONFIGURED if misconfigured else Reason.PROVIDER_TEMPORARY,
                    retry_delay=delay,
                    detail=detail,
                    **common,
                )
            detail["attempts"] = f"{step.attempt} of {max_attempts}"
            if step.maybe_delivered:
                return Transition(to_status=Status.UNKNOWN, reason=Reason.ATTEMPTS_EXHAUSTED, detail=detail, **common)
            return Transition(to_status=Status.REJECTED, reason=Reason.ATTEMPTS_EXHAUSTED, detail=detail, **common)
        case Unknown(reason=why):
            detail["message"] = why
            if dedupe_window_open and attempts_left:
                common["maybe_delivered"] = True
                return Transition(
                    to_status=Status.RETRYABLE,
                    reason=Reason.AMBIGUOUS_DEDUPED,
                    retry_delay=backoff.delay(step.attempt),
                    detail=detail,
                    **common,
                )
            return Transition(
                to_status=Status.UNKNOWN,
                reason=Reason.AMBIGUOUS_RESPONSE,
                detail=detail,
                **{**common, "maybe_delivered": True},
            )
    raise TypeError(f"not an outcome: {outcome!r}")
