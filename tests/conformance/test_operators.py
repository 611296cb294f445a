"""What operators and the reconciler do through the Store port, against the PostgreSQL store:
resolve (and each of its refusals), the reconciler's claim/found/absent, reading back,
and failure notices."""

from __future__ import annotations

import pytest

from evq.worker.errors import NotFound, StateConflict
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.ports import StepFilter
from evq.worker.resolution import Resolution
from evq.worker.states import Status
from tests.conformance.helpers import LEASE, T0, at, claim, evidence, kinds, rescue, row, settle
from tests.support import valid


async def unknown_step(store, *, now=T0, **kw) -> int:
    e = await store.enqueue(valid(**kw), now=now)
    claimed = await claim(store, now=now, providers=(kw.get("provider", "smtp"),))
    [step] = [c for c in claimed if c.id == e.id]
    await store.record([settle(step, Unknown("reply lost"))], actor="w1", now=now)
    return e.id


async def resolve(store, step_id, verdict, *, now, note="checked the mailbox", **kw):
    return await store.resolve(
        step_id, Resolution.parse(verdict, note, **kw), actor="operator:ada", default_max_attempts=3, now=now
    )


async def test_resolve_closes_an_unknown_row_with_an_audit_record(store):
    i = await unknown_step(store)
    done = await resolve(store, i, "accepted", now=at(10), provider_message_id="pm-1", reason="mailbox_seen")
    assert (done.from_status, done.to_status, done.resolved_at, done.attempts) == (
        Status.UNKNOWN,
        Status.ACCEPTED,
        at(10),
        1,
    )
    r = await row(store, i)
    assert (r["status"], r["reason"], r["detail"], r["provider_message_id"]) == (
        "accepted",
        "operator",
        "checked the mailbox",
        "pm-1",
    )
    assert r["closed_at"] == at(10) and r["unknown_since"] is None
    ev = (await evidence(store, i))[-1]
    assert ev["id"] == done.evidence_id
    assert (ev["kind"], ev["actor"], ev["from_status"], ev["to_status"], ev["reason"]) == (
        "operator_resolved",
        "operator:ada",
        "unknown",
        "accepted",
        "mailbox_seen",
    )
    d = ev["detail"]
    assert d["verdict"] == "accepted" and d["note"] == "checked the mailbox" and d["requeued"] is False
    assert d["previous"]["status"] == "unknown" and d["previous"]["reason"] == "ambiguous_response"
    assert d["reference"] == {"provider_message_id": "pm-1", "evidence_url": None}
    # A closed row is not resolved again; a missing one is not found.
    with pytest.raises(StateConflict) as err:
        await resolve(store, i, "rejected", now=at(11))
    assert err.value.context["status"] == "accepted"
    with pytest.raises(NotFound):
        await resolve(store, 9999, "rejected", now=at(11))


async def test_resolve_refuses_rows_that_are_not_unknown(store):
    e = await store.enqueue(valid(), now=T0)
    with pytest.raises(StateConflict):
        await resolve(store, e.id, "rejected", now=T0)
    [step] = await claim(store)
    with pytest.raises(StateConflict):
        await resolve(store, e.id, "accepted", now=T0)
    await store.record([settle(step, Rejected("550 no such user"))], actor="w1", now=T0)
    with pytest.raises(StateConflict):  # rejected by the provider: not a dead letter
        await resolve(store, e.id, "retry", now=T0)
    assert (await row(store, e.id))["status"] == "rejected"


async def test_retry_goes_back_with_one_more_attempt_when_they_are_spent(store):
    e = await store.enqueue(valid(max_attempts=1), now=T0)
    [step] = await claim(store)
    await store.record([settle(step, Unknown("reset"))], actor="w1", now=T0)
    done = await resolve(store, e.id, "retry", now=at(5))
    assert (done.to_status, done.max_attempts_before, done.max_attempts_after) == (Status.RETRYABLE, 1, 2)
    r = await row(store, e.id)
    assert (r["status"], r["maybe_delivered"], r["next_attempt_at"], r["max_attempts"]) == (
        "retryable",
        False,
        at(5),
        2,
    )
    [again] = await claim(store, now=at(5))
    assert again.attempt == 2 and again.message_id == e.message_id


async def test_retry_of_a_rescued_row_waits_for_the_attempt_to_be_over(store):
    e = await store.enqueue(valid(), now=T0)
    await claim(store)
    await rescue(store, at(LEASE + 1))
    # The lease ended at T0+60; the adapter's deadline is DEADLINE_SHARE (0.75) of it more.
    with pytest.raises(StateConflict) as err:
        await resolve(store, e.id, "retry", now=at(LEASE + 2))
    assert err.value.context["retry_possible_at"] == at(LEASE + 45).isoformat()
    assert (await row(store, e.id))["status"] == "unknown"
    assert (await resolve(store, e.id, "retry", now=at(LEASE + 46))).to_status is Status.RETRYABLE


async def test_retry_after_the_provider_accepted_is_refused_for_good(store):
    e = await store.enqueue(valid(), now=T0)
    [first] = await claim(store, windows={"smtp": 3600})
    await rescue(store, at(LEASE + 1))  # retryable: the window covers another lease
    [second] = await claim(store, now=at(LEASE + 2), windows={"smtp": 3600})
    await store.record([settle(second, Unknown("reset"))], actor="w1", now=at(LEASE + 3))
    # The first attempt's answer arrives: fenced (a later attempt began), kept as evidence.
    [late] = await store.record([settle(first, Accepted("pm-1"))], actor="w1", now=at(LEASE + 4))
    assert not late.settled and (await row(store, e.id))["status"] == "unknown"
    accepted = (await evidence(store, e.id))[-1]
    with pytest.raises(StateConflict) as err:
        await resolve(store, e.id, "retry", now=at(10_000))
    assert err.value.context["accepted_evidence"] == accepted["id"]
    assert (await resolve(store, e.id, "accepted", now=at(10_000))).to_status is Status.ACCEPTED


async def test_a_dead_letter_is_requeued_with_its_attempts_forgiven(store):
    e = await store.enqueue(valid(max_attempts=1), now=T0)
    [step] = await claim(store)
    await store.record([settle(step, Retryable("451"))], actor="w1", now=T0)
    r = await row(store, e.id)
    assert (r["status"], r["reason"]) == ("rejected", "attempts_exhausted")
    done = await resolve(store, e.id, "retry", now=at(30))
    assert (done.from_status, done.to_status) == (Status.REJECTED, Status.RETRYABLE)
    r = await row(store, e.id)
    assert (r["uncharged_attempts"], r["attempts"], r["retry_from"], r["closed_at"]) == (1, 1, at(30), None)
    assert (await evidence(store, e.id))[-1]["detail"]["requeued"] is True
    [again] = await claim(store, now=at(40))
    assert (again.attempt, again.charged_attempts, again.budget_age) == (2, 1, 10.0)


async def test_the_reconciler_claims_holds_and_settles_unknown_rows(store):
    a = await unknown_step(store, now=T0)
    b = await unknown_step(store, now=at(1))
    await unknown_step(store, now=at(2), provider="http")
    claim_args = dict(providers=["smtp"], max_checks=2, hold_seconds=120)
    first = await store.reconcile_claim(**claim_args, now=at(10))
    assert (first.id, first.reconcile_checks, first.idempotency_key) == (
        a,
        0,
        (await row(store, a))["idempotency_key"],
    )
    assert (await row(store, a))["reconcile_after"] == at(130)
    second = await store.reconcile_claim(**claim_args, now=at(10))
    assert second.id == b
    assert await store.reconcile_claim(**claim_args, now=at(10)) is None  # both held
    assert await store.reconcile_absent(
        b, next_check=60, detail={"found": False, "check": 1}, actor="reconciler", now=at(11)
    )
    rb = await row(store, b)
    assert (rb["status"], rb["reconcile_checks"], rb["reconcile_after"]) == ("unknown", 1, at(71))
    ev = (await evidence(store, b))[-1]
    assert (ev["kind"], ev["from_status"], ev["to_status"], ev["reason"]) == (
        "reconciled",
        "unknown",
        None,
        "reconcile_absent",
    )
    assert await store.reconcile_found(
        a, provider_message_id="pm-a", message="found it", detail={"found": True}, actor="reconciler", now=at(12)
    )
    ra = await row(store, a)
    assert (ra["status"], ra["reason"], ra["provider_message_id"], ra["closed_at"]) == (
        "accepted",
        "reconciled",
        "pm-a",
        at(12),
    )
    assert (ra["reconcile_checks"], ra["reconcile_after"], ra["unknown_since"]) == (1, None, None)
    # A closed row is left alone; a row past max_checks is not claimed again.
    assert not await store.reconcile_found(
        a, provider_message_id="x", message="m", detail={}, actor="reconciler", now=at(13)
    )
    assert not await store.reconcile_absent(a, next_check=1, detail={}, actor="reconciler", now=at(13))
    assert (await store.reconcile_claim(**claim_args, now=at(71))).id == b
    await store.reconcile_absent(b, next_check=60, detail={}, actor="reconciler", now=at(72))
    assert await store.reconcile_claim(**claim_args, now=at(1000)) is None
    assert await kinds(store, a) == ["attempt_started", "provider_response", "reconciled"]


async def test_list_steps_orders_unknown_oldest_first_and_counts_past_the_page(store):
    older = await unknown_step(store, now=T0)
    newer = await unknown_step(store, now=at(3600))
    pending = await store.enqueue(valid(run_id="run-x", cc=["c@example.net"]), now=at(10))
    found, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,), limit=1), now=at(7200))
    assert total == 2 and [f.id for f in found] == [older] and found[0].age_seconds == 7200.0
    found, total = await store.list_steps(StepFilter(limit=None))
    assert [f.id for f in found] == [older, newer, pending.id] and total == 3
    found, total = await store.list_steps(StepFilter(offset=5))
    assert (found, total) == ([], 3)
    found, _ = await store.list_steps(StepFilter(recipient_domain="EXAMPLE.net"))
    assert [f.id for f in found] == [pending.id] and found[0].recipients[-1] == "c@example.net"
    found, _ = await store.list_steps(StepFilter(created_before=at(3600)))
    assert {f.id for f in found} == {older, pending.id}
    found, _ = await store.list_steps(StepFilter(ids=(newer,), provider="smtp", run_id="run-1"))
    assert [f.id for f in found] == [newer] and found[0].subject.startswith("Subject")


async def test_get_run_and_get_step_read_steps_decisions_and_evidence(store):
    a = await store.enqueue(valid(run_id="run-r", step_id="a"), now=T0)
    b = await store.enqueue(valid(run_id="run-r", step_id="b"), now=at(1))
    await claim(store, now=at(2))
    run = await store.get_run("run-r", limit=50)
    assert [s["id"] for s in run.steps] == [a.id, b.id] and run.total == 2
    assert [d["step_id"] for d in run.decisions] == [a.step_id, b.step_id]
    assert [(e["step_id"], e["kind"]) for e in run.evidence] == [(a.id, "attempt_started"), (b.id, "attempt_started")]
    detail = await store.get_step(a.id)
    assert detail.decision["model"] == "m-1" and detail.decision["intent"] == "tell the user"
    assert detail.step["payload"]["subject"].startswith("Subject")
    with pytest.raises(NotFound):
        await store.get_run("nobody", limit=50)
    with pytest.raises(NotFound):
        await store.get_step(9999)


async def test_get_run_reads_a_page_of_the_runs_steps_in_step_id_order_with_only_their_history(store):
    """runs show's read: a page of the run's steps by step_id (its unique key), their decisions
    and evidence and nothing of the other steps, and the run's total; past the end, nothing."""
    made = {}
    for name in ("c", "a", "e", "b", "d"):  # enqueued out of step_id order
        made[name] = await store.enqueue(valid(run_id="run-p", step_id=name), now=T0)
    await store.enqueue(valid(run_id="run-other", step_id="a"), now=T0)
    await claim(store, now=at(1))
    page = await store.get_run("run-p", limit=2, offset=1)
    assert [s["step_id"] for s in page.steps] == ["b", "c"] and page.total == 5
    assert sorted(d["step_id"] for d in page.decisions) == ["b", "c"]
    assert all(d["run_id"] == "run-p" for d in page.decisions)
    assert sorted(e["step_id"] for e in page.evidence) == sorted([made["b"].id, made["c"].id])
    last = await store.get_run("run-p", limit=2, offset=4)
    assert [s["step_id"] for s in last.steps] == ["e"] and [e["step_id"] for e in last.evidence] == [made["e"].id]
    past = await store.get_run("run-p", limit=2, offset=5)
    assert (past.steps, past.decisions, past.evidence, past.total) == ([], [], [], 5)


async def test_get_steps_reads_each_as_get_step_does_in_the_ids_order(store):
    a = await store.enqueue(valid(run_id="run-m"), now=T0)
    decision = {"model": "m-2", "tool": "send_email", "instruction_version": "v1", "rationale": "asked"}
    b = await store.enqueue(valid(run_id="run-m", decision=decision), now=at(1))
    await claim(store, now=at(2))
    many = await store.get_steps([b.id, 9999, a.id, b.id])
    assert [d.step["id"] for d in many] == [b.id, a.id]  # no step 9999; a repeated id once
    for d in many:
        one = await store.get_step(d.step["id"])
        assert d.decision == one.decision and d.evidence == one.evidence
        assert {k: v for k, v in d.step.items() if k != "age_seconds"} == {
            k: v for k, v in one.step.items() if k != "age_seconds"
        }
    assert many[0].decision["model"] == "m-2" and [e["kind"] for e in many[1].evidence] == ["attempt_started"]
    assert await store.get_steps([]) == [] and await store.get_steps([9999]) == []


async def test_a_rejection_enqueues_one_notice_with_the_transition(store):
    e = await store.enqueue(valid(notify="owner@example.com"), now=T0)
    [step] = await claim(store)
    t = settle(step, Rejected("550 no such user"))
    await store.record([t], actor="w1", now=at(1))
    await store.record([t], actor="w1", now=at(2))  # a retried commit: no second notice
    ev = (await evidence(store, e.id))[-1]
    assert (ev["kind"], ev["reason"], ev["actor"]) == ("notice_enqueued", "rejected", "w1")
    assert ev["detail"]["to"] == "owner@example.com"
    notice = await row(store, ev["detail"]["notice_step"])
    assert (notice["notice_of"], notice["notify"], notice["status"]) == (e.id, None, "pending")
    assert notice["idempotency_key"] == f"evq:notice:rejected:{e.idempotency_key}"
    _, total = await store.list_steps(StepFilter())
    assert total == 2
    # Unknown owes none by default.
    u = await unknown_step(store, now=at(3), notify="owner@example.com")
    assert "notice_enqueued" not in await kinds(store, u)


async def test_find_by_key_and_the_latest_answers(store):
    req = valid(step_id="k")
    assert await store.find_by_key(req) is None
    e = await store.enqueue(req, now=T0)
    found = await store.find_by_key(valid(step_id="k"))  # another payload, the same key
    assert (found["id"], found["status"], found["created"], found["message_id"]) == (
        e.id,
        "pending",
        False,
        e.message_id,
    )
    other = await store.enqueue(valid(), now=T0)
    [a, b] = await claim(store)
    await store.record([settle(a, Unknown("lost")), settle(b, Retryable("451"))], actor="w1", now=at(1))
    await store.reconcile_absent(e.id, next_check=60, detail={"found": False}, actor="rec", now=at(2))
    answers = await store.last_answers([e.id, other.id, 9999])
    assert set(answers) == {e.id, other.id}
    assert (answers[e.id]["kind"], answers[e.id]["reason"]) == ("reconciled", "reconcile_absent")
    assert (answers[other.id]["kind"], answers[other.id]["outcome"]) == ("provider_response", "retryable")
    assert await store.last_answers([]) == {}


async def test_list_facts_gives_each_listed_step_its_held_and_provider_columns(store):
    from evq.worker.approval_policy import ApprovalPolicy

    held = await store.enqueue(valid(step_id="h"), now=T0, approval=ApprovalPolicy(always=True))
    sent = await unknown_step(store, now=at(1))
    await resolve(store, sent, "accepted", now=at(2), provider_message_id="pm-7")
    facts = await store.list_facts([held.id, sent, 9999])
    assert set(facts) == {held.id, sent}
    assert facts[held.id]["held_since"] == T0 and facts[held.id]["hold"]
    assert facts[held.id]["message_id"] == held.message_id and facts[held.id]["provider_message_id"] is None
    assert facts[sent]["provider_message_id"] == "pm-7" and facts[sent]["held_since"] is None
    assert await store.list_facts([]) == {}
