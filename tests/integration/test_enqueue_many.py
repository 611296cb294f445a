"""Batch enqueue (multi-row statements): every guarantee of the single enqueue, kept."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from evq.adapters.postgres.batch_enqueue import MANY_CHUNK, enqueue_many_op
from evq.adapters.postgres.enqueue import enqueue_own
from evq.adapters.postgres.op_runner import run_sync
from evq.worker.enqueue import validate_many
from evq.worker.errors import Conflict, IdempotencyConflict, InvalidRequest
from tests.support import POLICY, request, rows, valid


def enqueue_many_own(url: str, requests: list, *, policy=POLICY):
    """What `evq enqueue --file` does: validate all, then one transaction of multi-row statements."""
    valid = validate_many(requests, policy)
    with psycopg.connect(url) as conn:
        results = run_sync(conn, enqueue_many_op(valid))
        conn.commit()
        return results


def counts(url: str) -> tuple[int, int]:
    return (
        rows(url, "SELECT count(*) AS n FROM steps_now")[0]["n"],
        rows(url, "SELECT count(*) AS n FROM decisions")[0]["n"],
    )


def test_many_requests_become_steps_with_their_decisions_in_order(db_url):
    reqs = [request(run_id="bulk", step_id=f"s{i}", provider="null" if i % 2 else "smtp") for i in range(50)]
    results = enqueue_many_own(db_url, reqs, policy=POLICY)
    assert [r.step_id for r in results] == [f"s{i}" for i in range(50)]
    assert all(r.created and r.status == "pending" for r in results)
    assert counts(db_url) == (50, 50)
    # Each step points at the decision written for it, not a neighbour's.
    mismatched = rows(
        db_url,
        "SELECT s.id FROM steps_now s JOIN decisions d ON d.id = s.decision_id "
        "WHERE d.run_id <> s.run_id OR d.step_id <> s.step_id",
    )
    assert mismatched == []
    assert len({r.message_id for r in results}) == 50
    # The stored request is exactly the validated one (the digest was made from it).
    from evq.worker.request import parse

    stored = {r["step_id"]: r["payload"] for r in rows(db_url, "SELECT step_id, payload FROM steps_now")}
    assert all(stored[q["step_id"]] == parse(q, POLICY).payload for q in reqs)


def test_batch_and_single_enqueue_store_the_same_rows(db_url):
    """The batch statement's positional encoding stores every field as the single enqueue
    does, and the results built client-side for created rows name what was stored."""
    decisions = [
        {
            "model": "m",
            "tool": "t",
            "instruction_version": "v9",
            "prompt_version": "p2",
            "rationale": {"why": ["nested", 1, None, 'é \\ " \n']},
            "decided_at": "2026-01-01T09:00:00+02:00",
        },
        {"rationale": 'plain text, "quoted"'},
        {"rationale": [1, 2]},
        None,
    ]
    extra = [
        {"max_attempts": 3, "notify": "ops@example.org", "headers": {"References": "<a@b>"}},
        {},
        {"cc": ["c@example.com"]},
        {},
    ]
    reqs = [
        request(run_id="batch", step_id=f"s{i}", decision=d, intent=None if d is None else "why", **x)
        for i, (d, x) in enumerate(zip(decisions, extra, strict=True))
    ]
    batch = enqueue_many_own(db_url, reqs)
    singles = [enqueue_own(db_url, {**q, "run_id": "single"}, policy=POLICY) for q in reqs]
    cols = (
        "step_id",
        "provider",
        "payload",
        "payload_sha256",
        "max_attempts",
        "notify",
        "status",
        "attempts",
        "intent",
        "instruction_version",
        "prompt_version",
        "model",
        "tool",
        "rationale",
        "no_rationale",
        "decided_at",
    )
    sql = (
        "SELECT s.*, d.intent, d.instruction_version, d.prompt_version, d.model, d.tool, d.rationale, d.decided_at, "
        "d.rationale IS NULL AS no_rationale "
        "FROM email_steps s JOIN decisions d ON d.id = s.decision_id WHERE s.run_id = %s ORDER BY s.id"
    )
    stored_batch, stored_single = rows(db_url, sql, ("batch",)), rows(db_url, sql, ("single",))
    assert [{c: r[c] for c in cols} for r in stored_batch] == [{c: r[c] for c in cols} for r in stored_single]
    assert stored_batch[0]["rationale"] == decisions[0]["rationale"] and stored_batch[3]["no_rationale"]
    assert [(r.id, r.message_id, r.status, r.idempotency_key, r.run_id, r.step_id) for r in batch] == [
        (r["id"], r["message_id"], r["status"], r["idempotency_key"], r["run_id"], r["step_id"]) for r in stored_batch
    ]
    assert all(r.created for r in batch + singles)


def test_repeats_return_the_existing_step_and_write_no_decision(db_url):
    old = request(run_id="bulk", step_id="old")
    first = enqueue_own(db_url, old, policy=POLICY)
    again = [old, request(run_id="bulk", step_id="new")]
    # The same request twice in one batch, too: the second gets the first's step.
    results = enqueue_many_own(db_url, [*again, again[1]], policy=POLICY)
    assert [(r.step_id, r.created) for r in results] == [("old", False), ("new", True), ("new", False)]
    assert results[0].id == first.id and results[0].message_id == first.message_id
    assert results[2].id == results[1].id
    assert counts(db_url) == (2, 2)


@pytest.mark.parametrize("where", ["before", "inside"])
def test_a_different_request_under_a_taken_key_fails_the_whole_batch(db_url, where):
    taken = request(run_id="bulk", step_id="k")
    if where == "before":
        enqueue_own(db_url, taken, policy=POLICY)
        batch = [request(run_id="bulk", step_id="a"), {**taken, "text": "a different body"}]
    else:
        batch = [request(run_id="bulk", step_id="a"), taken, {**taken, "text": "a different body"}]
    with pytest.raises(IdempotencyConflict) as err:
        enqueue_many_own(db_url, batch, policy=POLICY)
    assert err.value.code == "E_CONFLICT"
    assert counts(db_url) == ((1, 1) if where == "before" else (0, 0))


def test_a_taken_run_and_step_under_another_key_is_a_conflict(db_url):
    enqueue_own(db_url, request(run_id="bulk", step_id="x"), policy=POLICY)
    with pytest.raises(IdempotencyConflict):
        enqueue_many_own(db_url, [request(run_id="bulk", step_id="x", idempotency_key="other-key")], policy=POLICY)
    assert counts(db_url) == (1, 1)


def test_every_request_is_validated_before_anything_is_written(db_url):
    batch = [
        request(run_id="bulk", step_id="ok"),
        request(run_id="bulk", step_id="bad", to=[]),
        request(run_id="bulk", step_id="worse", subject="a\nb"),
    ]
    with pytest.raises(InvalidRequest) as err:
        enqueue_many_own(db_url, batch, policy=POLICY)
    assert [f["field"].split(".")[0] for f in err.value.errors] == ["[1]", "[2]"]
    assert counts(db_url) == (0, 0)


def test_large_batches_span_several_statements_in_one_transaction(db_url):
    size = MANY_CHUNK + 7
    valid_requests = [valid(run_id="big", step_id=f"s{i}") for i in range(size)]
    with psycopg.connect(db_url) as conn:
        results = run_sync(conn, enqueue_many_op(valid_requests))
        assert len(results) == size and all(r.created for r in results)
        conn.rollback()  # the caller's transaction decides: all of it goes
    assert counts(db_url) == (0, 0)


def test_one_notification_per_provider(db_url):
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN evq_steps")
        enqueue_many_own(db_url, [request(run_id="n", provider=p) for p in ["smtp"] * 5 + ["null"] * 5], policy=POLICY)
        notes = list(listener.notifies(timeout=1.0, stop_after=10))
    assert sorted(n.payload for n in notes) == ["null", "smtp"]


async def test_the_store_enqueues_many_in_one_transaction(store, db_url):
    results = await store.enqueue_many([valid(run_id="st", step_id=f"s{i}") for i in range(10)])
    assert all(r.created for r in results) and counts(db_url) == (10, 10)
    # Concurrent batches of the same keys: one step per key, never a second.
    batch = [valid(run_id="race", step_id=f"s{i}") for i in range(20)]
    outs = await asyncio.gather(*(store.enqueue_many(batch) for _ in range(3)), return_exceptions=True)
    done = [o for o in outs if not isinstance(o, BaseException)]
    assert done and all(not isinstance(o, BaseException) or isinstance(o, Conflict) for o in outs)
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now WHERE run_id = 'race'")[0]["n"] == 20
    assert sum(r.created for o in done for r in o) == 20


def test_a_batch_writes_the_same_decision_as_a_single_enqueue(db_url):
    decision = {
        "model": "m-2",
        "tool": "send_email",
        "instruction_version": "v9",
        "prompt_version": "p3",
        "rationale": {"why": "asked", "score": 0.9},
        "decided_at": "2026-01-01T09:00:00+02:00",
    }
    enqueue_own(db_url, request(run_id="one", step_id="x", decision=decision, notify="ops@example.org"), policy=POLICY)
    enqueue_many_own(
        db_url, [request(run_id="many", step_id="x", decision=decision, notify="ops@example.org")], policy=POLICY
    )
    columns = "intent, instruction_version, prompt_version, model, tool, rationale, decided_at"
    one, many = (rows(db_url, f"SELECT {columns} FROM decisions WHERE run_id = %s", (r,))[0] for r in ("one", "many"))
    assert one == many and many["rationale"] == {"why": "asked", "score": 0.9}
    notify = rows(db_url, "SELECT DISTINCT notify, max_attempts FROM steps_now")
    assert notify == [{"notify": "ops@example.org", "max_attempts": None}]


# -- the public API: evq.enqueue_many / evq.enqueue_many_async in the caller's transaction ----


def test_evq_enqueue_many_commits_and_rolls_back_with_the_callers_transaction(db_url):
    import evq

    with psycopg.connect(db_url) as conn:
        with conn.transaction():
            kept = evq.enqueue_many(conn, [request(run_id="pub", step_id=f"k{i}") for i in range(3)], policy=POLICY)
        with pytest.raises(RuntimeError), conn.transaction():
            evq.enqueue_many(conn, [request(run_id="pub", step_id="gone")], policy=POLICY)
            raise RuntimeError("the caller's own work failed")
    assert [(r.step_id, r.created) for r in kept] == [("k0", True), ("k1", True), ("k2", True)]
    assert all(isinstance(r, evq.EnqueueResult) for r in kept)
    assert counts(db_url) == (3, 3)


def test_one_bad_request_in_evq_enqueue_many_writes_nothing_even_when_the_caller_commits(db_url):
    """Every request is validated before the first statement: the caller that catches the error
    and commits the rest of its transaction has written no step and no decision."""
    import evq

    batch = [request(run_id="pub", step_id="ok"), request(run_id="pub", step_id="bad", to=["not an address"])]
    with psycopg.connect(db_url) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            with pytest.raises(evq.InvalidRequest) as err:
                evq.enqueue_many(conn, batch, policy=POLICY)
    assert isinstance(err.value, evq.EvqError) and err.value.code == "E_INVALID_ARG"
    assert [e["field"].split(".")[0] for e in err.value.errors] == ["[1]"]
    assert counts(db_url) == (0, 0)
    assert rows(db_url, "SELECT id FROM orders") == [{"id": 1}]


def test_evq_enqueue_many_on_a_sqlalchemy_connection(db_url):
    import sqlalchemy as sa

    import evq
    from evq.adapters.postgres.database import sqlalchemy_url

    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        with engine.begin() as conn:
            results = evq.enqueue_many(conn, [request(run_id="sa", step_id=f"s{i}") for i in range(2)], policy=POLICY)
        with pytest.raises(evq.InvalidRequest), engine.begin() as conn:
            evq.enqueue_many(conn, [request(run_id="sa", step_id="x"), request(run_id="sa", to=[])], policy=POLICY)
    finally:
        engine.dispose()
    assert all(r.created for r in results) and counts(db_url) == (2, 2)


async def test_evq_enqueue_many_async_on_psycopg_and_sqlalchemy(db_url):
    from sqlalchemy.ext.asyncio import create_async_engine

    import evq
    from evq.adapters.postgres.database import sqlalchemy_url

    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        async with conn.transaction():
            a = await evq.enqueue_many_async(
                conn, [request(run_id="as", step_id=f"a{i}") for i in range(2)], policy=POLICY
            )
        with pytest.raises(evq.InvalidRequest):
            async with conn.transaction():
                await evq.enqueue_many_async(conn, [request(run_id="as", step_id="c"), {"run_id": "as"}], policy=POLICY)
    engine = create_async_engine(sqlalchemy_url(db_url))
    try:
        async with engine.begin() as conn:
            one = request(run_id="as", step_id="b0")
            b = await evq.enqueue_many_async(conn, [one], policy=POLICY)
            # A repeat inside the same transaction returns the step it just wrote.
            again = await evq.enqueue_many_async(conn, [one], policy=POLICY)
    finally:
        await engine.dispose()
    assert all(r.created for r in a + b) and again[0].created is False and again[0].id == b[0].id
    assert counts(db_url) == (3, 3)
