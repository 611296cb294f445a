"""From one attempt's outcome to the step's next state: pure, so it is tested without I/O.

The rules (docs/design.md, "States and transitions", and invariant 4):
- Accepted -> accepted; Rejected -> rejected.
- Retryable -> retryable after a backoff, or rejected once the retry budget
  (``retry_for``, from the enqueue or an operator's requeue) or the attempts are spent.
  An attempt that hit a provider-level fault (``charged=False``, worker/circuit.py) is
  not counted against the attempts: the provider's circuit holds the step instead.
- A step that an earlier attempt may have delivered never ends ``rejected``: a
  rejection tells the sender (and its failure notice) that it did not go out. Spent
  attempts, and a refusal of a later attempt (the policy re-check, a provider that
  no longer knows the key), end ``unknown`` instead.
- Unknown -> unknown; unless the provider dedupes our key and its window is still
  open, then retryable (the next attempt reuses the key, the provider sends once).
"""

from __future__ import annotations

from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted, Outcome, Rejected, Retryable, Unknown, refused_recipients
from evq.worker.records import ClaimedStep, Transition, build_transition
from evq.worker.states import Reason, Status


def decide(
    step: ClaimedStep,
    outcome: Outcome,
    *,
    default_max_attempts: int,
    backoff: Backoff,
    dedupe_window_open: bool,
    latency_ms: float | None = None,
    retry_for: float = float("inf"),
    charged: bool = True,
) -> Transition:
    if type(outcome) is Accepted and not outcome.response:
        # Nearly every send: accepted with nothing more said (no refused recipients, so no
        # message), made without the general path's copies and closure.
        # Every field in Transition's order: step_id, lease_token, attempt, to_status, reason,
        # outcome, provider_message_id, retry_delay, maybe_delivered, latency_ms, detail, charged.
        return build_transition(
            step.id,
            step.lease_token,
            step.attempt,
            Status.ACCEPTED,
            Reason.PROVIDER_ACCEPTED,
            "accepted",
            outcome.provider_message_id,
            None,
            step.maybe_delivered,
            latency_ms,
            {},
            True,
        )
    max_attempts = step.max_attempts or default_max_attempts
    charged_attempts = step.charged_attempts - (0 if charged else 1)
    attempts_left = charged_attempts < max_attempts
    # Seconds of the retry budget left when the outcome is decided (an attempt lasts at
    # most a lease, so counting from the claim is close enough for a budget of days).
    budget_left = retry_for - step.budget_age
    detail = dict(outcome.response)

    def move(
        to_status: Status,
        reason: Reason,
        *,
        provider_message_id: str | None = None,
        retry_delay: float | None = None,
        maybe_delivered: bool = step.maybe_delivered,
        charged: bool = True,
    ) -> Transition:
        """This attempt's transition: fenced by its lease, with ``detail`` as the branch left it."""
        return Transition(
            step_id=step.id,
            lease_token=step.lease_token,
            attempt=step.attempt,
            to_status=to_status,
            reason=reason,
            outcome=outcome.kind,
            provider_message_id=provider_message_id,
            retry_delay=retry_delay,
            maybe_delivered=maybe_delivered,
            latency_ms=latency_ms,
            detail=detail,
            charged=charged,
        )

    match outcome:
        case Accepted(provider_message_id=pmid):
            refused = refused_recipients(detail)
            if refused:
                detail["message"] = "accepted, but refused for " + "; ".join(
                    f"{r['recipient']} ({r['code']} {r['reply']})".rstrip() for r in refused
                )
            return move(
                Status.ACCEPTED,
                Reason.PARTIALLY_REFUSED if refused else Reason.PROVIDER_ACCEPTED,
                provider_message_id=pmid,
            )
        case Rejected(reason=why, before_send=before_send):
            detail["message"] = why
            reason = Reason.POLICY_REFUSED if before_send else Reason.PROVIDER_REJECTED
            if step.maybe_delivered:
                detail["message"] = f"{why}; but an earlier attempt may have been delivered"
                return move(Status.UNKNOWN, reason)
            return move(Status.REJECTED, reason)
        case Retryable(reason=why, retry_after=retry_after, misconfigured=misconfigured):
            detail["message"] = why
            if not charged:
                detail["charged"] = False
            if attempts_left and budget_left > 0:
                # Uncharged: the circuit holds the step while the provider is down; once it
                # closes the step goes at once, not after a backoff grown by the outage.
                delay = backoff.delay(charged_attempts if charged else 1)
                if retry_after is not None:
                    delay = max(delay, retry_after)
                # The last retry is at the end of the budget, not after it.
                delay = min(delay, budget_left)
                return move(
                    Status.RETRYABLE,
                    Reason.PROVIDER_MISCONFIGURED if misconfigured else Reason.PROVIDER_TEMPORARY,
                    retry_delay=delay,
                    charged=charged,
                )
            reason = Reason.ATTEMPTS_EXHAUSTED if not attempts_left else Reason.RETRY_BUDGET_EXHAUSTED
            detail["attempts"] = f"{charged_attempts} of {max_attempts}" + (
                f" ({step.attempt - charged_attempts} not charged)" if step.attempt != charged_attempts else ""
            )
            detail["retried_for_seconds"] = round(step.budget_age, 1)
            if step.maybe_delivered:
                return move(Status.UNKNOWN, reason, charged=charged)
            return move(Status.REJECTED, reason, charged=charged)
        case Unknown(reason=why):
            detail["message"] = why
            if dedupe_window_open and attempts_left:
                return move(
                    Status.RETRYABLE,
                    Reason.AMBIGUOUS_DEDUPED,
                    retry_delay=backoff.delay(step.attempt),
                    maybe_delivered=True,
                )
            return move(Status.UNKNOWN, Reason.AMBIGUOUS_RESPONSE, maybe_delivered=True)
    raise TypeError(f"not an outcome: {outcome!r}")
