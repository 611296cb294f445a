"""The key ledger against a real database (invariant 12): a key evq prune has passed is answered
as its step ended on every enqueue path, an enqueue racing the prune of its key makes no second
step, and an approver's correction is kept with the agent's own request.

The prune's cutoff is the database's clock, so the history here is written in the past."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from evq.adapters.postgres.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async, enqueue_own
from evq.worker.approval_actions import edited
from evq.worker.approval_policy import ApprovalPolicy, Budget
from evq.worker.backoff import Backoff
from evq.worker.errors import IdempotencyConflict
from evq.worker.outcomes import Accepted
from evq.worker.records import EnqueueResult
from evq.worker.states import Status
from evq.worker.transitions import decide
from tests.support import POLICY, accepted_step, prune_closed, request, rows, valid, wait_until, with_store

OLD = datetime.now(UTC) - timedelta(days=30)


def steps(db_url: str) -> list[dict]:
    return rows(db_url, "SELECT id, idempotency_key, status FROM steps_now ORDER BY id")


def a_step_as_an_older_evq_wrote_it(db_url: str, req: dict) -> int:
    """An accepted step with no ledger row: enqueued by a process running code that predates the
    ledger (the statement wrote the step and its decision only)."""
    v = valid(**req)
    with psycopg.connect(db_url) as conn:
        [step_id] = conn.execute(
            """
            WITH d AS (INSERT INTO decisions (run_id, step_id) VALUES (%(run)s, %(step)s) RETURNING id)
            INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                                     payload_sha256, status, attempts, first_attempt_at, created_at, closed_at)
            SELECT %(run)s, %(step)s, d.id, %(key)s, '<old.1@example.org>', 'smtp', %(payload)s::jsonb, %(sha)s,
                   'accepted', 1, %(at)s, %(at)s, %(at)s
            FROM d RETURNING id
            """,
            {
                "run": v.run_id,
                "step": v.step_id,
                "key": v.idempotency_key,
                "payload": v.payload_json,
                "sha": v.payload_sha256,
                "at": OLD,
            },
        ).fetchone()
        return step_id


@pytest.mark.parametrize("written_by", ["this evq", "an older evq"])
async def test_an_enqueue_racing_the_prune_of_its_key_makes_no_second_step(store, db_url, written_by):
    """Two connections: evq prune deletes the step and records its end in the ledger, and its
    transaction is held open right there; meanwhile the agent's retry of the same request
    enqueues. Whatever the retry sees (the step, or the prune waited for), no second step is
    made, once the prune commits or ever after. A step with no ledger row yet (written by code that
    predates the ledger) is recorded by the prune's upsert on the same key."""
    req = request(run_id="race", step_id="welcome")
    if written_by == "this evq":
        first = await accepted_step(store, req, now=OLD)
        step_id, message_id = first.id, first.message_id
    else:
        step_id, message_id = a_step_as_an_older_evq_wrote_it(db_url, req), "<old.1@example.org>"
        assert rows(db_url, "SELECT count(*) AS n FROM step_keys")[0]["n"] == 0

    prune = psycopg.connect(db_url)
    try:
        [n] = prune.execute(
            "SELECT pruned_steps FROM evq_prune_batch(now(), 100, 'test', gen_random_uuid(), 1)"
        ).fetchone()
        assert n == 1  # deleted and recorded, not committed

        answers: list = []

        def retry() -> None:
            try:
                answers.append(enqueue_own(db_url, req, policy=POLICY))
            except Exception as exc:
                answers.append(exc)

        agent = threading.Thread(target=retry)
        agent.start()
        # The retry has answered, or waits on the prune's transaction: either way it is inside
        # the race when the prune commits.
        waiting = (
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND %s = ANY(pg_blocking_pids(pid))"
        )
        wait_until(
            lambda: answers or rows(db_url, waiting, (prune.info.backend_pid,))[0]["n"],
            what="the retry to answer or to wait for the prune",
        )
        prune.commit()
        agent.join(30)
    finally:
        prune.close()

    [answer] = answers
    assert steps(db_url) == []  # no second step, and none will be sent
    assert isinstance(answer, EnqueueResult), answer
    assert (answer.id, answer.message_id, answer.status, answer.created) == (step_id, message_id, "accepted", False)
    [kept] = rows(
        db_url, "SELECT id, message_id, status, pruned_at FROM step_keys WHERE idempotency_key = 'race:welcome'"
    )
    assert (kept["id"], kept["message_id"], kept["status"]) == (step_id, message_id, "accepted")
    assert kept["pruned_at"] is not None
    # And every retry after the commit is answered from the ledger.
    later = enqueue_own(db_url, req, policy=POLICY)
    assert (later.id, later.created, later.pruned) == (step_id, False, True) and steps(db_url) == []


async def test_every_python_api_path_answers_a_pruned_key_from_the_ledger(store, db_url):
    req = request(run_id="api", step_id="welcome")
    first = await accepted_step(store, req, now=OLD)
    assert prune_closed(db_url) == 1
    new = request(run_id="api", step_id="later")

    def same(result: EnqueueResult) -> None:
        assert (result.id, result.message_id, result.created) == (first.id, first.message_id, False)
        assert (result.status, result.pruned) == (Status.ACCEPTED, True)

    with psycopg.connect(db_url) as conn:
        with conn.transaction():
            same(enqueue(conn, req, policy=POLICY))
            answered, made = enqueue_many(conn, [req, new], policy=POLICY)
        same(answered)
        assert made.created and not made.pruned
        # Under an approval policy (the gated path: budgets charged only for a new step).
        budgets = replace(POLICY, approval=ApprovalPolicy(budgets=((Budget.RUN_RECIPIENTS, 10),)))
        with conn.transaction():
            same(enqueue(conn, req, policy=budgets))
            [again] = enqueue_many(conn, [req], policy=budgets)
        same(again)
        assert rows(db_url, "SELECT count(*) AS n FROM send_budgets WHERE used > 0")[0]["n"] == 0  # charged nothing
        # Through a provider that could never settle a lost answer, with EVQ_REFUSE_UNRESOLVABLE:
        # looked up first, answered as the step ended rather than refused.
        strict = replace(POLICY, unresolvable=("smtp",), refuse_unresolvable=True)
        same(enqueue(conn, req, policy=strict))
        with pytest.raises(IdempotencyConflict) as changed:
            enqueue(conn, {**req, "subject": "something else"}, policy=POLICY)
        assert changed.value.context["pruned"] is True
    async with await psycopg.AsyncConnection.connect(db_url) as aconn:
        same(await enqueue_async(aconn, req, policy=POLICY))
        [answered_async] = await enqueue_many_async(aconn, [req], policy=POLICY)
        same(answered_async)
        await aconn.commit()
    same(enqueue_own(db_url, req, policy=POLICY))
    assert [s["idempotency_key"] for s in steps(db_url)] == ["api:later"]
    # Every step has its key in the ledger, written with it.
    assert rows(db_url, "SELECT idempotency_key FROM step_keys ORDER BY id") == [
        {"idempotency_key": "api:welcome"},
        {"idempotency_key": "api:later"},
    ]


async def test_a_corrected_send_is_answered_after_prune_for_the_agents_request_and_the_correction(store, db_url):
    """An approver corrected the subject: the step went out with the correction, and the ledger
    keeps both digests, so the agent's retry of what it asked and the corrected request are both
    answered as the step ended; a third text is another send, refused."""
    asked = request(run_id="fix", step_id="s", subject="Helo", require_approval=True)
    made = await store.enqueue(valid(**asked), now=OLD)
    held = (await store.get_step(made.id)).step
    edit = edited(held["payload"], "smtp", {"subject": "Hello"}, POLICY, from_sha256=held["payload_sha256"])
    await store.approve(made.id, actor="ada", actor_key_id="k-ada", note="typo", edit=edit, now=OLD)
    [claimed] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=OLD)
    transition = decide(
        claimed, Accepted("pm"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False
    )
    await store.record([transition], actor="w", now=OLD)
    assert prune_closed(db_url) == 1
    for retry in (asked, {**asked, "subject": "Hello"}):
        again = await store.enqueue(valid(**retry))
        assert (again.id, again.created, again.status) == (made.id, False, Status.ACCEPTED) and again.pruned
    with pytest.raises(IdempotencyConflict):
        await store.enqueue(valid(**{**asked, "subject": "Hi"}))
    assert steps(db_url) == []
    [kept] = rows(
        db_url, "SELECT encode(payload_sha256, 'hex') AS asked, encode(corrected_sha256, 'hex') AS sent FROM step_keys"
    )
    assert (kept["asked"], kept["sent"]) == (valid(**asked).payload_sha256, edit.payload_sha256)


def test_the_prune_keeps_a_ledger_row_only_once_and_nothing_deletes_it(db_url):
    """The owner's prune records a step's end once; the ledger refuses a DELETE, a TRUNCATE and a
    rewrite of what an enqueue wrote or what a prune recorded, to anyone (the owner included)."""
    req = request(run_id="kept", step_id="s")
    with_store(db_url, lambda store: accepted_step(store, req, now=OLD))
    assert prune_closed(db_url) == 1
    for sql in (
        "DELETE FROM step_keys",
        "TRUNCATE step_keys",
        "UPDATE step_keys SET status = 'rejected'",
        "UPDATE step_keys SET message_id = '<forged@example.com>'",
    ):
        with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
    assert rows(db_url, "SELECT status FROM step_keys") == [{"status": "accepted"}]


def test_a_key_pruned_under_one_run_and_step_is_refused_under_others(db_url):
    """The ledger answers by key: the same key with other run and step ids is another send, refused
    (as for a stored step), and the run and step ids, free again, take a new key."""
    req = request(run_id="ids", step_id="s", idempotency_key="order-42")
    with_store(db_url, lambda store: accepted_step(store, req, now=OLD))
    assert prune_closed(db_url) == 1
    with pytest.raises(IdempotencyConflict):
        enqueue_own(db_url, {**req, "step_id": "other"}, policy=POLICY)
    fresh = enqueue_own(db_url, {**req, "idempotency_key": "order-43"}, policy=POLICY)
    assert fresh.created and [s["idempotency_key"] for s in steps(db_url)] == ["order-43"]


def test_two_keys_racing_for_one_run_and_step_leave_one_step_and_no_key_without_a_step(db_url):
    """Two connections enqueue the same run and step ids under different keys, the first holding
    its transaction open: the second's ledger row goes in (its key is free) and its step waits on
    the first's run and step ids; when the first commits the second is refused whole
    (IdempotencyConflict), so the ledger never names a key whose step does not exist."""
    first, second = request(run_id="ids", step_id="s", idempotency_key="k-1"), request(run_id="ids", step_id="s")
    second["idempotency_key"] = "k-2"
    holder = psycopg.connect(db_url)
    try:
        made = enqueue(holder, first, policy=POLICY)  # written, not committed
        answers: list = []

        def race() -> None:
            try:
                answers.append(enqueue_own(db_url, second, policy=POLICY))
            except Exception as exc:
                answers.append(exc)

        other = threading.Thread(target=race)
        other.start()
        waiting = (
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND %s = ANY(pg_blocking_pids(pid))"
        )
        wait_until(lambda: answers or rows(db_url, waiting, (holder.info.backend_pid,))[0]["n"], what="the race")
        holder.commit()
        other.join(30)
    finally:
        holder.close()
    [answer] = answers
    assert isinstance(answer, IdempotencyConflict), answer
    assert [s["idempotency_key"] for s in steps(db_url)] == ["k-1"]
    assert rows(db_url, "SELECT idempotency_key, id FROM step_keys") == [{"idempotency_key": "k-1", "id": made.id}]
