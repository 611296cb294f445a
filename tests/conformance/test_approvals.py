"""The held lifecycle through the ApprovalStore and ExpireStore ports, against the PostgreSQL store:
approve (with and without a correction), deny (the notice), cancel (what may and may not be
cancelled) and the expiry pass."""

from __future__ import annotations

from datetime import timedelta

import pytest

from evq.worker.approval_actions import edited
from evq.worker.errors import StateConflict
from evq.worker.outcomes import Unknown
from evq.worker.states import Status
from tests.conformance.helpers import T0, at, claim, evidence, kinds, row, settle
from tests.support import POLICY, held_steps, valid


async def test_approve_makes_a_held_step_pending_with_the_same_key_and_message_id(store):
    (made,) = await held_steps(store, now=T0, run_id="r-ap", step_id="a")
    done = await store.approve(made.id, actor="ada", actor_key_id="k-ada", note="looks right", now=at(5))
    assert (done.from_status, done.to_status, done.reason) == (Status.HELD, Status.PENDING, "approved")
    s = await row(store, made.id)
    assert s["status"] == "pending" and s["reason"] == "approved" and s["held_since"] is None
    assert s["message_id"] == made.message_id and s["idempotency_key"] == made.idempotency_key
    assert s["next_attempt_at"] == at(5) and s["requested_sha256"] is None
    approved = (await evidence(store, made.id))[-1]
    assert approved["kind"] == "approved" and approved["actor"] == "ada"
    assert approved["detail"]["note"] == "looks right" and approved["detail"]["edited"] is False
    # Claimable now, once: the worker sends it, its retry budget counted from the approval
    # (issue 29), not from the enqueue: the wait for a person is not the provider's time.
    [claimed] = await claim(store, now=at(6))
    assert claimed.id == made.id and claimed.budget_age == 1.0
    # A second approval finds it no longer held.
    with pytest.raises(StateConflict):
        await store.approve(made.id, actor="bob", actor_key_id="k-bob", note="me too", now=at(7))


async def test_the_key_that_enqueued_a_held_send_never_approves_it_at_the_store(store):
    """A second person decides, in the statement itself (step_approve): whatever interface
    forgot to check, the enqueuing key's id is refused and nothing changes; another key's is not."""
    from dataclasses import replace

    from evq.worker.errors import Forbidden
    from evq.worker.request import Actor

    asked = replace(
        valid(run_id="r-self", step_id="s", require_approval=True), actor=Actor("http", "0123456789ab", "ada")
    )
    made = await store.enqueue(asked, now=T0)
    assert (await row(store, made.id))["status"] == "held"
    with pytest.raises(Forbidden) as refused:
        await store.approve(made.id, actor="ada", actor_key_id="0123456789ab", note="mine", now=at(1))
    assert refused.value.code == "E_AUTH_FAILED" and "enqueued step" in refused.value.message
    assert (await row(store, made.id))["status"] == "held" and await kinds(store, made.id) == ["held"]
    done = await store.approve(made.id, actor="bob", actor_key_id="0123456789ac", note="checked", now=at(2))
    assert done.to_status == Status.PENDING


async def test_approve_with_a_correction_keeps_the_agents_hash_and_both_are_evidence(store):
    (made,) = await held_steps(store, now=T0, run_id="r-ed", step_id="e")
    s = await row(store, made.id)
    edit = edited(s["payload"], s["provider"], {"subject": "Corrected"}, POLICY, from_sha256=s["payload_sha256"])
    assert edit is not None and edit.fields == ("subject",)
    done = await store.approve(made.id, actor="ada", actor_key_id="k-ada", note="typo", edit=edit, now=at(1))
    after = await row(store, made.id)
    assert after["payload"]["subject"] == "Corrected"
    assert after["payload_sha256"] == edit.payload_sha256 == done.payload_sha256
    assert after["requested_sha256"] == s["payload_sha256"] == done.requested_sha256
    detail = (await evidence(store, made.id))[-1]["detail"]
    assert detail["edited"] is True and detail["fields"] == ["subject"]
    assert (detail["from_sha256"], detail["to_sha256"]) == (s["payload_sha256"], edit.payload_sha256)


async def test_a_correction_of_a_payload_changed_since_it_was_read_is_refused(store):
    (made,) = await held_steps(store, now=T0)
    s = await row(store, made.id)
    edit = edited(s["payload"], s["provider"], {"text": "new"}, POLICY, from_sha256="0" * 64)
    with pytest.raises(StateConflict):
        await store.approve(made.id, actor="ada", actor_key_id="k-ada", note="x", edit=edit, now=at(1))
    assert (await row(store, made.id))["status"] == "held"


async def known_to_the_sender(store, address: str) -> None:
    """``address`` made one the sender may mail: a held send to it, approved (known_recipients)."""
    (teach,) = await held_steps(store, now=T0, run_id="r-teach", step_id=address, to=[address])
    await store.approve(teach.id, actor="ada", actor_key_id="k-ada", note="a colleague", now=at(1))


async def test_deny_rejects_and_tells_notify(store):
    await known_to_the_sender(store, "owner@example.com")
    (made,) = await held_steps(store, now=T0, notify="Owner@example.com")
    done = await store.deny(made.id, actor="ada", note="not to this customer", now=at(2))
    assert (done.to_status, done.reason) == (Status.REJECTED, "denied")
    s = await row(store, made.id)
    assert s["status"] == "rejected" and s["reason"] == "denied" and s["closed_at"] == at(2)
    assert await kinds(store, made.id) == ["held", "denied", "notice_enqueued"]
    with pytest.raises(StateConflict):
        await store.deny(made.id, actor="ada", note="again", now=at(3))
    claimed = await claim(store, now=at(10), limit=10)
    assert claimed and made.id not in [c.id for c in claimed]  # the notice (and the approved send), never it


async def test_a_denied_or_expired_held_send_never_tells_a_notify_address_its_sender_may_not_mail(store):
    """Issue 29: the request's notify is the agent's word, and a held send nobody approved is
    not a person's: a stranger there gets no notice of its denial or expiry."""
    denied, expired = await held_steps(store, 2, now=T0, expires_at=at(60), notify="stranger@victim.example")
    await store.deny(denied.id, actor="ada", note="cold contact", now=at(2))
    assert await store.expire_held(limit=10, actor="expirer", now=at(61)) == 1
    assert await kinds(store, denied.id) == ["held", "denied"]
    assert await kinds(store, expired.id) == ["held", "hold_expired"]
    assert await claim(store, now=at(70), limit=10) == []  # no notice was made


async def test_cancel_pending_and_held_but_not_in_flight_or_maybe_delivered(store):
    (held,) = await held_steps(store, now=T0)
    pending = await store.enqueue(valid(run_id="r-c", step_id="p"), now=T0)
    for step in (held, pending):
        done = await store.cancel(step.id, actor="agent-1", note="no longer needed", now=at(1))
        assert (done.to_status, done.reason) == (Status.REJECTED, "cancelled")
        assert (await kinds(store, step.id))[-1] == "cancelled"
    assert await claim(store, now=at(2)) == []
    # In flight: a worker is sending it.
    other = await store.enqueue(valid(step_id="f"), now=at(3))
    (claimed,) = await claim(store, now=at(4))
    with pytest.raises(StateConflict) as refused:
        await store.cancel(other.id, actor="agent-1", note=None, now=at(5))
    assert "in flight" in refused.value.message
    # Unknown (may have been delivered): an operator resolves it.
    await store.record([settle(claimed, Unknown("lost"))], actor="w1", now=at(6))
    with pytest.raises(StateConflict) as unknown:
        await store.cancel(other.id, actor="agent-1", note=None, now=at(7))
    assert "evq steps resolve" in (unknown.value.hint or "")


async def test_expire_held_closes_those_past_their_expiry_and_tells_notify(store):
    await known_to_the_sender(store, "owner@example.com")
    late = await held_steps(store, 2, now=T0, expires_at=at(60), notify="owner@example.com")
    (later,) = await held_steps(store, now=T0, expires_at=at(600))
    (never,) = await held_steps(store, now=T0)
    assert await store.expire_held(limit=1, actor="expirer", now=at(59)) == 0
    assert await store.expire_held(limit=1, actor="expirer", now=at(61)) == 1
    assert await store.expire_held(limit=10, actor="expirer", now=at(61)) == 1
    for m in late:
        s = await row(store, m.id)
        assert (s["status"], s["reason"]) == ("rejected", "approval_expired")
        assert await kinds(store, m.id) == ["held", "hold_expired", "notice_enqueued"]
    assert (await row(store, later.id))["status"] == "held"
    assert (await row(store, never.id))["status"] == "held"
    assert await store.expire_held(limit=10, actor="expirer", now=T0 + timedelta(days=30)) == 1


async def test_the_agents_retry_of_its_original_request_still_gets_the_corrected_step(store):
    asked = valid(run_id="r-rt", step_id="rt", require_approval=True)
    made = await store.enqueue(asked, now=T0)
    assert made.status == "held"
    s = await row(store, made.id)
    edit = edited(s["payload"], s["provider"], {"text": "Corrected body"}, POLICY, from_sha256=s["payload_sha256"])
    await store.approve(made.id, actor="ada", actor_key_id="k-ada", note="fixed the body", edit=edit, now=at(1))
    again = await store.enqueue(asked, now=at(2))
    assert (again.id, again.created, again.message_id) == (made.id, False, made.message_id)
    found = await store.find_by_key(asked)
    assert found is not None and found["requested_sha256"] == asked.payload_sha256
    # A request that is neither the agent's nor the corrected one is still refused.
    from evq.worker.errors import IdempotencyConflict

    with pytest.raises(IdempotencyConflict):
        await store.enqueue(valid(run_id="r-rt", step_id="rt", text="a third body"), now=at(3))
