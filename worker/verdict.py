"""The ambiguity contract: what an agent reading a step may do next (docs/design.md,
"The ambiguity contract").

Every interface's view of a step carries ``safe_to_retry`` and ``next_action`` from
:func:`verdict`, so an agent never has to guess from a status whether a resend could
duplicate the email. ``safe_to_retry`` is true only when evq knows nothing was sent: a
rejected step with no possibly delivered attempt. It answers "would a new send of this
message be a duplicate?", not "will it succeed" (``next_action`` says that).
"""

from __future__ import annotations

from dataclasses import dataclass

from evq.worker.states import Reason, Status

# next_action values, with what each asks of the agent (the JSON Schemas and `evq schema` list them).
NEXT_ACTIONS = {
    "wait": "evq is still working on it (queued, sending, retrying or settling a lost answer); "
    "wait for it (`evq steps wait`, GET /v1/steps/{id}?wait=30s), never resend",
    "wait_for_approval": "held for a person's approval (an operator or admin, never the key that enqueued it); "
    "wait for the decision (`evq steps wait` answers once a person approved and it was sent, or denied it; "
    "the step's approval says until when), never resend",
    "ask_operator": "nobody can tell whether it was sent and nothing will settle it on its own; "
    "an operator must close it (`evq steps resolve`); never resend",
    "none": "finished: sent, or deliberately stopped (denied, cancelled, closed by an operator); do nothing",
    "fix_and_resend": "the provider or policy refused this message; nothing was sent; a corrected "
    "message as a new step is safe",
    "resend": "nothing was sent and nothing is wrong with the message (attempts or time ran out, "
    "approval expired); enqueue it again as a new step, or ask an operator to requeue it",
}

# Rejected steps whose message is fine: nothing went out for reasons of time or attempts.
_RESEND = frozenset({Reason.ATTEMPTS_EXHAUSTED, Reason.RETRY_BUDGET_EXHAUSTED, Reason.APPROVAL_EXPIRED})
# Rejected steps a person or the agent stopped on purpose (an operator's close: see verdict).
_STOPPED = frozenset({Reason.DENIED, Reason.CANCELLED})


@dataclass(frozen=True, slots=True)
class Verdict:
    safe_to_retry: bool
    next_action: str

    def to_dict(self) -> dict[str, object]:
        return {"safe_to_retry": self.safe_to_retry, "next_action": self.next_action}


# How long an unknown step may wait for its provider to settle it before an operator must: the
# reconciler's default checks are spent in about 16 minutes (30 s doubling, 5 checks), and a
# webhook's first event comes within minutes of a message the provider had. Past this, nothing
# is likely to settle it on its own (a provider that never had the message sends no event).
SETTLE_WITHIN = 3600.0


def verdict(
    status: str, reason: str | None, *, maybe_delivered: bool, resolvable: bool, unknown_for: float | None = None
) -> Verdict:
    """``resolvable``: whether the step's provider can settle a lost answer by itself
    (its profile: dedupe, lookup or webhook); an ``unknown`` step it cannot settle, or one
    unknown for :data:`SETTLE_WITHIN` seconds or more (``unknown_for``), needs an operator."""
    state = Status(status)
    if state is Status.HELD:
        return Verdict(False, "wait_for_approval")
    if state in (Status.PENDING, Status.IN_FLIGHT, Status.RETRYABLE):
        return Verdict(False, "wait")
    if state is Status.UNKNOWN:
        settling = resolvable and (unknown_for is None or unknown_for < SETTLE_WITHIN)
        return Verdict(False, "wait" if settling else "ask_operator")
    if state is Status.ACCEPTED:
        return Verdict(False, "none")
    # Rejected: closed. Who closed it decides what is left to do; maybe_delivered decides
    # whether sending it again could be a duplicate.
    if reason == Reason.OPERATOR:
        # An operator's verdict (from unknown, so as a rule it may have been delivered): the
        # person decided, the step is finished; sending again is safe only if nothing may have gone.
        return Verdict(not maybe_delivered, "none")
    if reason == Reason.LATE_ANSWER:
        # The provider's own definite refusal of the attempt the rescuer had marked "may have
        # been delivered" (its lease ran out first). step_record_late settles a rejection only
        # for the latest attempt and only when no earlier one may have been delivered, so the
        # flag it leaves set is that attempt's, now answered: nothing was sent (its notice says
        # the provider refused the message).
        return Verdict(True, "fix_and_resend")
    # No other path closes a step rejected that may have been delivered (invariant 4: such an
    # answer leaves it unknown); should the flag be set anyway, fail closed.
    if maybe_delivered:
        return Verdict(False, "ask_operator")
    if reason in _STOPPED:
        return Verdict(True, "none")
    if reason in _RESEND:
        return Verdict(True, "resend")
    return Verdict(True, "fix_and_resend")
