"""From an attempt's outcome to the next state (docs/design.md, "States and transitions", invariant 4)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.records import ClaimedStep
from evq.worker.states import TRANSITIONS, Reason, Status
from evq.worker.transitions import decide


def step(attempt=1, max_attempts=None, maybe_delivered=False, **fields) -> ClaimedStep:
    """A claimed step as the claim statement returns it; ``fields`` set the rest (uncharged_attempts, ...)."""
    return ClaimedStep(
        id=1,
        run_id="r",
        step_id="s",
        idempotency_key="r:s",
        message_id="<m@x>",
        provider="smtp",
        payload={},
        attempt=attempt,
        max_attempts=max_attempts,
        lease_token=uuid.uuid4(),
        lease_seconds=60,
        dedupe_remaining=None,
        maybe_delivered=maybe_delivered,
        created_at=datetime.now(UTC),
        **fields,
    )


def go(s, outcome, window=False):
    return decide(s, outcome, default_max_attempts=3, backoff=Backoff(10, 100), dedupe_window_open=window)


def test_accepted_and_rejected_are_terminal():
    t = go(step(), Accepted("q1"))
    assert (t.to_status, t.reason, t.provider_message_id) == (Status.ACCEPTED, Reason.PROVIDER_ACCEPTED, "q1")
    assert go(step(), Rejected("550")).to_status is Status.REJECTED
    assert go(step(), Rejected("blocked", before_send=True)).reason is Reason.POLICY_REFUSED


def test_retryable_backs_off_then_exhausts():
    t = go(step(attempt=1), Retryable("451"))
    assert t.to_status is Status.RETRYABLE and 10 <= t.retry_delay <= 20
    assert go(step(attempt=2), Retryable("451", retry_after=500)).retry_delay == 500
    t = go(step(attempt=3), Retryable("451"))
    assert (t.to_status, t.reason) == (Status.REJECTED, Reason.ATTEMPTS_EXHAUSTED)
    assert go(step(attempt=3, max_attempts=5), Retryable("451")).to_status is Status.RETRYABLE


def test_exhausted_after_a_possible_delivery_is_unknown_not_rejected():
    t = go(step(attempt=3, maybe_delivered=True), Retryable("503"))
    assert (t.to_status, t.reason) == (Status.UNKNOWN, Reason.ATTEMPTS_EXHAUSTED)


def test_ambiguous_is_unknown_unless_the_provider_dedupes():
    t = go(step(), Unknown("reset after the final dot"))
    assert (t.to_status, t.reason, t.maybe_delivered) == (Status.UNKNOWN, Reason.AMBIGUOUS_RESPONSE, True)
    t = go(step(), Unknown("timeout"), window=True)
    assert (t.to_status, t.reason, t.maybe_delivered) == (Status.RETRYABLE, Reason.AMBIGUOUS_DEDUPED, True)
    assert go(step(attempt=3), Unknown("timeout"), window=True).to_status is Status.UNKNOWN


@pytest.mark.parametrize("outcome", [Accepted("q"), Rejected("x"), Retryable("y"), Unknown("z")])
def test_every_decision_is_a_legal_transition(outcome):
    for s in (step(1), step(3), step(3, maybe_delivered=True)):
        for window in (False, True):
            assert go(s, outcome, window).to_status in TRANSITIONS[Status.IN_FLIGHT]


def test_a_refusal_after_a_possible_delivery_is_unknown_not_rejected():
    """A later attempt refused (the policy re-check, a provider that forgot the key)
    says nothing about the earlier one that may have gone out."""
    t = go(step(attempt=2, maybe_delivered=True), Rejected("domain now blocked", before_send=True))
    assert (t.to_status, t.reason) == (Status.UNKNOWN, Reason.POLICY_REFUSED)
    assert "earlier attempt may have been delivered" in t.detail["message"]
    t = go(step(attempt=2, maybe_delivered=True), Rejected("422"))
    assert (t.to_status, t.reason, t.definite) == (Status.UNKNOWN, Reason.PROVIDER_REJECTED, False)
    assert go(step(), Rejected("422")).definite


def test_a_refused_session_is_retryable_as_provider_misconfigured():
    t = go(step(), Retryable("504 Helo command rejected", misconfigured=True))
    assert (t.to_status, t.reason) == (Status.RETRYABLE, Reason.PROVIDER_MISCONFIGURED)
    # It still spends attempts (the circuit breaker, not this rule, keeps them from being spent).
    assert go(step(attempt=3), Retryable("x", misconfigured=True)).reason is Reason.ATTEMPTS_EXHAUSTED


def test_accepted_with_refused_recipients_is_a_partial_refusal():
    refused = {"b@example.com": {"code": 550, "reply": "5.1.1 no such user"}}
    t = go(step(), Accepted("q1", response={"refused": refused}))
    assert (t.to_status, t.reason) == (Status.ACCEPTED, Reason.PARTIALLY_REFUSED)
    assert t.detail["message"] == "accepted, but refused for b@example.com (550 5.1.1 no such user)"
    assert go(step(), Accepted("q1", response={"refused": {}})).reason is Reason.PROVIDER_ACCEPTED
