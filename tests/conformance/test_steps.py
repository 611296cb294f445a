"""The worker's transitions, through the Store port, against the PostgreSQL store: enqueue, claim,
record (fenced, late, duplicate), release, orphans, rescue and the dedupe window."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from evq.worker.errors import IdempotencyConflict
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.ports import StepFilter
from evq.worker.records import Transition
from evq.worker.request import parse
from evq.worker.states import Reason, Status
from tests.conformance.helpers import LEASE, T0, at, claim, evidence, kinds, rescue, row, settle
from tests.support import POLICY, request, valid


async def test_enqueue_is_idempotent_and_a_different_request_under_the_key_is_refused(store):
    req = valid(step_id="a")
    first = await store.enqueue(req, now=T0)
    again = await store.enqueue(req, now=T0)
    assert first.created and not again.created
    assert (again.id, again.message_id, again.status) == (first.id, first.message_id, Status.PENDING)
    with pytest.raises(IdempotencyConflict):
        await store.enqueue(valid(step_id="a", text="another body"), now=T0)
    # The same run and step under another key is the same step: refused too.
    with pytest.raises(IdempotencyConflict):
        await store.enqueue(valid(step_id="a", idempotency_key="other-key"), now=T0)
    _, total = await store.list_steps(StepFilter())
    assert total == 1
    step = await row(store, first.id)
    assert step["status"] == "pending" and step["attempts"] == 0 and step["next_attempt_at"] == T0
    assert step["created_at"] == T0 and step["first_attempt_at"] is None and step["closed_at"] is None
    assert await kinds(store, first.id) == []


async def test_enqueue_many_is_all_or_nothing(store):
    taken = valid(step_id="taken")
    await store.enqueue(taken, now=T0)
    batch = [valid(step_id="n1"), valid(step_id="taken"), valid(step_id="n2")]  # another payload
    with pytest.raises(IdempotencyConflict):
        await store.enqueue_many(batch)
    _, total = await store.list_steps(StepFilter())
    assert total == 1
    made = await store.enqueue_many([valid(step_id="n1"), taken])
    assert [m.created for m in made] == [True, False]


async def test_the_same_key_through_another_provider_is_another_send_and_refused(store):
    asked = request(run_id="r-p", step_id="p")
    first = await store.enqueue(parse(asked, POLICY), now=T0)
    assert first.provider == "smtp"
    other = parse({**asked, "provider": "http"}, POLICY)
    assert other.payload_sha256 == parse(asked, POLICY).payload_sha256  # the hash leaves the provider out
    with pytest.raises(IdempotencyConflict) as refused:
        await store.enqueue(other, now=T0)
    assert refused.value.message.startswith("this key was enqueued through smtp;")
    assert refused.value.context["existing_id"] == first.id
    with pytest.raises(IdempotencyConflict, match="enqueued through smtp"):
        await store.enqueue_many([valid(step_id="p-new"), other])
    found = await store.find_by_key(other)
    assert (found["id"], found["provider"]) == (first.id, "smtp")
    _, total = await store.list_steps(StepFilter())
    assert total == 1  # neither the conflict nor the batch wrote anything
    [again] = await store.enqueue_many([parse(asked, POLICY)])
    assert (again.id, again.created, again.provider) == (first.id, False, "smtp")


async def test_claim_takes_due_rows_oldest_first_and_commits_the_attempt(store):
    late = await store.enqueue(valid(), now=at(5))
    early = await store.enqueue(valid(), now=T0)
    other = await store.enqueue(valid(provider="null"), now=T0)
    assert await claim(store, now=at(-1)) == []  # none is due yet
    [first] = await claim(store, now=at(10), limit=1, claim_id="c1")
    assert first.id == early.id and first.attempt == 1 and first.message_id == early.message_id
    assert first.lease_token == uuid.UUID(hashlib.md5(f"c1:{early.id}".encode()).hexdigest())
    assert first.dedupe_remaining is None and not first.maybe_delivered and first.budget_age == 10.0
    step = await row(store, early.id)
    assert (step["status"], step["attempts"], step["lease_owner"]) == ("in_flight", 1, "w1")
    assert step["lease_token"] == first.lease_token and step["lease_expires_at"] == at(10 + LEASE)
    assert step["first_attempt_at"] == at(10) and step["updated_at"] == at(10)
    [ev] = await evidence(store, early.id)
    assert (ev["kind"], ev["attempt"], ev["from_status"], ev["to_status"]) == (
        "attempt_started",
        1,
        "pending",
        "in_flight",
    )
    assert ev["lease_token"] == first.lease_token and ev["actor"] == "w1" and ev["created_at"] == at(10)
    [second] = await claim(store, now=at(10))
    assert second.id == late.id
    assert await claim(store, now=at(10)) == []  # in flight rows are not claimed again
    assert (await row(store, other.id))["status"] == "pending"  # another provider's


async def test_claimable_exists_follows_the_claims_filter(store):
    await store.enqueue(valid(), now=at(5))
    assert not await store.claimable_exists(providers=["smtp"], lease_seconds=LEASE, now=T0)
    assert not await store.claimable_exists(providers=["http"], lease_seconds=LEASE, now=at(5))
    assert await store.claimable_exists(providers=["smtp"], lease_seconds=LEASE, now=at(5))
    await claim(store, now=at(5))
    assert not await store.claimable_exists(providers=["smtp"], lease_seconds=LEASE, now=at(5))


@pytest.mark.parametrize(
    ("outcome", "status", "reason"),
    [
        (Accepted("queue-1"), "accepted", "provider_accepted"),
        (Rejected("550 no such user"), "rejected", "provider_rejected"),
        (Unknown("reply lost"), "unknown", "ambiguous_response"),
        (Retryable("451 try later"), "retryable", "provider_temporary"),
    ],
)
async def test_record_applies_each_outcome_under_its_lease(store, outcome, status, reason):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    [result] = await store.record([settle(step, outcome, latency_ms=12.5)], actor="w1", now=at(1))
    assert result.applied and not result.settled and not result.duplicate
    r = await row(store, e.id)
    assert (r["status"], r["reason"]) == (status, reason)
    assert r["lease_token"] is None and r["lease_owner"] is None and r["lease_expires_at"] is None
    assert r["closed_at"] == (at(1) if status in ("accepted", "rejected") else None)
    assert r["unknown_since"] == (at(1) if status == "unknown" else None)
    assert r["maybe_delivered"] == (status == "unknown")
    assert r["next_attempt_at"] == (at(2) if status == "retryable" else T0)
    assert r["provider_message_id"] == ("queue-1" if status == "accepted" else None)
    assert r["detail"] == (None if status == "accepted" else outcome.reason)
    assert r["updated_at"] == at(1)
    ev = (await evidence(store, e.id))[1]
    assert (ev["kind"], ev["outcome"], ev["from_status"], ev["to_status"], ev["reason"]) == (
        "provider_response",
        outcome.kind,
        "in_flight",
        status,
        reason,
    )
    assert ev["lease_token"] == step.lease_token and ev["latency_ms"] == 12.5 and ev["attempt"] == 1


async def test_an_uncharged_attempt_is_counted_apart(store):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    await store.record([settle(step, Retryable("refused"), charged=False)], actor="w1", now=T0)
    r = await row(store, e.id)
    assert (r["attempts"], r["uncharged_attempts"]) == (1, 1)
    [again] = await claim(store, now=at(5))
    assert (again.attempt, again.uncharged_attempts, again.charged_attempts, again.budget_age) == (2, 1, 1, 5.0)
    assert (await evidence(store, e.id))[1]["detail"]["charged"] is False


async def test_a_stale_lease_is_fenced_its_answer_kept_and_the_row_unchanged(store):
    e = await store.enqueue(valid(), now=T0)
    [old] = await claim(store, owner="zombie")
    assert await store.release([old], actor="zombie", now=at(1)) == 1
    [fresh] = await claim(store, owner="w2", now=at(2))
    assert fresh.lease_token != old.lease_token and fresh.attempt == 1
    [late] = await store.record([settle(old, Accepted("zombie-id"))], actor="zombie", now=at(3))
    assert not late.applied and not late.settled and not late.duplicate
    r = await row(store, e.id)
    assert (r["status"], r["lease_owner"], r["provider_message_id"]) == ("in_flight", "w2", None)
    ev = (await evidence(store, e.id))[-1]
    assert (ev["kind"], ev["from_status"], ev["to_status"], ev["outcome"]) == (
        "late_response",
        "in_flight",
        None,
        "accepted",
    )
    assert ev["detail"]["fenced"] is True and ev["detail"]["settled"] is False and ev["detail"]["row_attempts"] == 1
    # A wrong attempt number under the right token is fenced too.
    wrong = Transition(
        step_id=e.id,
        lease_token=fresh.lease_token,
        attempt=2,
        to_status=Status.ACCEPTED,
        reason=Reason.PROVIDER_ACCEPTED,
        outcome="accepted",
    )
    [result] = await store.record([wrong], actor="w2", now=at(4))
    assert not result.applied and (await row(store, e.id))["status"] == "in_flight"


async def test_recording_twice_is_a_duplicate_not_a_second_answer(store):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    t = settle(step, Accepted("q"))
    await store.record([t], actor="w1", now=at(1))
    [again] = await store.record([t], actor="w1", now=at(2))
    assert not again.applied and again.duplicate and not again.settled
    assert await kinds(store, e.id) == ["attempt_started", "provider_response"]


async def test_a_batch_applies_what_it_can_and_fences_the_rest(store):
    a = await store.enqueue(valid(), now=T0)
    b = await store.enqueue(valid(), now=T0)
    sa, sb = await claim(store)
    await store.release([sb], actor="w1", now=T0)
    results = await store.record([settle(sa, Accepted("qa")), settle(sb, Accepted("qb"))], actor="w1", now=at(1))
    by_id = {r.step_id: r for r in results}
    assert by_id[a.id].applied and not by_id[b.id].applied
    assert (await row(store, b.id))["status"] == "pending"


async def test_a_definite_late_answer_settles_a_rescued_row_an_ambiguous_one_does_not(store):
    a = await store.enqueue(valid(), now=T0)
    b = await store.enqueue(valid(), now=T0)
    sa, sb = await claim(store)
    assert (await rescue(store, at(LEASE + 1))).unknown == 2
    [la] = await store.record([settle(sa, Accepted("q-9"))], actor="w1", now=at(LEASE + 2))
    [lb] = await store.record([settle(sb, Unknown("reset"))], actor="w1", now=at(LEASE + 2))
    assert la.settled and not la.applied and not lb.settled and not lb.duplicate
    ra = await row(store, a.id)
    assert (ra["status"], ra["reason"], ra["provider_message_id"]) == ("accepted", "late_answer", "q-9")
    assert ra["closed_at"] == at(LEASE + 2) and ra["unknown_since"] is None
    ev = (await evidence(store, a.id))[-1]
    assert (ev["kind"], ev["from_status"], ev["to_status"], ev["reason"]) == (
        "late_response",
        "unknown",
        "accepted",
        "late_answer",
    )
    rb = await row(store, b.id)
    assert (rb["status"], rb["reason"]) == ("unknown", "lease_expired")
    # The same late answer again is a duplicate and settles nothing more.
    [again] = await store.record([settle(sb, Accepted("q-late"))], actor="w1", now=at(LEASE + 3))
    assert again.duplicate and not again.settled and (await row(store, b.id))["status"] == "unknown"


async def test_a_late_answer_never_settles_a_row_whose_next_attempt_began(store):
    e = await store.enqueue(valid(), now=T0)
    [old] = await claim(store, windows={"smtp": 3600})
    assert (await rescue(store, at(LEASE + 1))).retryable == 1
    [new] = await claim(store, now=at(LEASE + 2), windows={"smtp": 3600})
    assert new.attempt == 2 and new.maybe_delivered
    await store.record([settle(new, Retryable("451"))], actor="w1", now=at(LEASE + 3))
    [late] = await store.record([settle(old, Accepted("first"))], actor="w1", now=at(LEASE + 4))
    assert not late.settled and not late.applied
    assert (await row(store, e.id))["status"] == "retryable"


async def test_rescue_makes_expired_leases_unknown_and_leaves_live_ones(store):
    e = await store.enqueue(valid(), now=T0)
    await claim(store, owner="dead")
    assert (await rescue(store, at(LEASE))).total == 0  # expires_at < now, strictly
    counts = await rescue(store, at(LEASE + 1))
    assert (counts.unknown, counts.retryable, counts.window_closed) == (1, 0, 0)
    r = await row(store, e.id)
    assert (r["status"], r["reason"], r["maybe_delivered"]) == ("unknown", "lease_expired", True)
    assert r["unknown_since"] == at(LEASE + 1) and r["lease_token"] is None
    assert r["detail"] == "lease held by dead expired during attempt 1"
    ev = (await evidence(store, e.id))[-1]
    assert (ev["kind"], ev["from_status"], ev["to_status"], ev["actor"]) == (
        "lease_expired",
        "in_flight",
        "unknown",
        "rescuer",
    )
    assert ev["detail"]["lease_owner"] == "dead"
    assert (await rescue(store, at(LEASE + 2))).total == 0
    assert await claim(store, now=at(LEASE + 2)) == []  # never back to pending


async def test_rescue_retries_only_while_the_window_covers_a_lease_and_attempts_are_left(store):
    a = await store.enqueue(valid(), now=T0)
    b = await store.enqueue(valid(max_attempts=1), now=T0)
    await claim(store, windows={"smtp": 3600})
    counts = await rescue(store, at(LEASE + 1))
    assert (counts.retryable, counts.unknown) == (1, 1)
    ra, rb = await row(store, a.id), await row(store, b.id)
    assert (ra["status"], ra["maybe_delivered"], ra["dedupe_until"]) == ("retryable", True, at(3600))
    assert ra["next_attempt_at"] == at(LEASE + 1) and ra["unknown_since"] is None
    assert rb["status"] == "unknown"  # its one attempt is spent
    # Once the window no longer covers a whole lease the row is not claimed: it closes as unknown.
    closing = at(3600 - LEASE)
    assert await claim(store, now=closing, windows={"smtp": 3600}) == []
    counts = await rescue(store, closing)
    assert (counts.window_closed, counts.unknown, counts.retryable) == (1, 0, 0)
    ra = await row(store, a.id)
    assert (ra["status"], ra["reason"], ra["unknown_since"]) == ("unknown", "dedupe_window_closed", closing)
    ev = (await evidence(store, a.id))[-1]
    assert (ev["kind"], ev["from_status"], ev["to_status"]) == ("window_closed", "retryable", "unknown")


async def test_the_dedupe_window_is_counted_from_the_first_attempt_and_never_grows(store):
    e = await store.enqueue(valid(), now=T0)
    [first] = await claim(store, windows={"smtp": 600})
    assert first.dedupe_remaining == 600.0
    await store.record([settle(first, Retryable("451"))], actor="w1", now=at(10))
    [second] = await claim(store, now=at(100), windows={"smtp": 6000})
    assert second.dedupe_remaining == 500.0
    assert (await row(store, e.id))["dedupe_until"] == at(600)


async def test_release_hands_back_only_the_lease_it_names(store):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    assert await store.release([], actor="w1", now=T0) == 0
    assert await store.release([step], actor="w1", now=at(1)) == 1
    r = await row(store, e.id)
    assert (r["status"], r["attempts"], r["reason"], r["first_attempt_at"]) == ("pending", 0, "released", None)
    assert r["next_attempt_at"] == at(1)
    ev = (await evidence(store, e.id))[-1]
    assert (ev["kind"], ev["attempt"], ev["to_status"], ev["lease_token"]) == (
        "attempt_released",
        1,
        "pending",
        step.lease_token,
    )
    assert await store.release([step], actor="w1", now=at(1)) == 0  # not in flight any more
    [again] = await claim(store, now=at(1))
    await store.record([settle(again, Retryable("451"))], actor="w1", now=at(1))
    [third] = await claim(store, now=at(5))
    assert await store.release([third], actor="w1", now=at(5)) == 1
    r = await row(store, e.id)
    assert (r["status"], r["attempts"], r["first_attempt_at"]) == ("retryable", 1, at(1))


async def test_release_orphans_frees_only_rows_of_lost_claims_not_held(store):
    a = await store.enqueue(valid(), now=T0)
    b = await store.enqueue(valid(), now=T0)
    c = await store.enqueue(valid(), now=T0)
    [received] = await claim(store, owner="me", limit=1, claim_id="claim-answered")
    lost = await claim(store, owner="me", limit=2, claim_id="claim-lost")
    assert received.id == a.id and {s.id for s in lost} == {b.id, c.id}
    kept = [s.lease_token for s in lost if s.id == c.id]
    assert await store.release_orphans(owner="someone-else", held=[], claims=["claim-lost"], now=T0) == 0
    assert await store.release_orphans(owner="me", held=kept, claims=["claim-lost"], now=T0) == 1
    assert [(await row(store, i))["status"] for i in (a.id, b.id, c.id)] == ["in_flight", "pending", "in_flight"]
    assert await store.release_orphans(owner="me", held=[], claims=[], now=T0) == 0


async def test_the_rows_the_verdict_is_read_from_carry_reason_and_maybe_delivered(store):
    """The ambiguity verdict (worker/verdict.py) needs a row's reason and maybe_delivered: a list's
    rows have them, and a repeated enqueue (one request, or in a batch) answers with them."""
    req = valid(run_id="r-v", step_id="lost")
    made = await store.enqueue(req, now=T0)
    assert (made.reason, made.maybe_delivered) == (None, False)
    [claimed] = await claim(store)
    await store.record([settle(claimed, Unknown("connection lost after the final dot"))], actor="w1", now=at(1))
    await store.enqueue(valid(run_id="r-v", step_id="new"), now=at(2))
    listed = {r.step_id: (r.status, r.maybe_delivered) for r in (await store.list_steps(StepFilter(run_id="r-v")))[0]}
    assert listed == {"lost": (Status.UNKNOWN, True), "new": (Status.PENDING, False)}
    again = await store.enqueue(req, now=at(3))
    assert (again.created, again.status, again.reason, again.maybe_delivered) == (
        False,
        Status.UNKNOWN,
        Reason.AMBIGUOUS_RESPONSE,
        True,
    )
    [batched] = [r for r in await store.enqueue_many([req, valid(run_id="r-v", step_id="third")]) if not r.created]
    assert (batched.id, batched.reason, batched.maybe_delivered) == (made.id, Reason.AMBIGUOUS_RESPONSE, True)
    found = await store.find_by_key(req)
    assert found is not None and (found["reason"], found["maybe_delivered"]) == (Reason.AMBIGUOUS_RESPONSE, True)
