"""The Python enqueue API inside the caller's own transaction (psycopg and SQLAlchemy)."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from evq.adapters.postgres.database import sqlalchemy_url
from evq.adapters.postgres.enqueue import enqueue, enqueue_async, enqueue_own
from evq.worker.errors import IdempotencyConflict, InvalidRequest
from tests.support import POLICY, request, rows


def count(url: str) -> tuple[int, int]:
    r = rows(url, "SELECT (SELECT count(*) FROM steps_now) AS s, (SELECT count(*) FROM decisions) AS d")[0]
    return r["s"], r["d"]


def test_psycopg_transaction_commits_and_rolls_back_with_the_caller(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute("CREATE TABLE orders (id int)")
        conn.commit()
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            step = enqueue(conn, request(step_id="kept"), policy=POLICY)
            assert step.created
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            enqueue(conn, request(step_id="rolled-back"), policy=POLICY)
            raise RuntimeError("the caller's own work failed")
    assert count(db_url) == (1, 1)
    assert rows(db_url, "SELECT step_id FROM steps_now") == [{"step_id": "kept"}]
    assert rows(db_url, "SELECT id FROM orders") == [{"id": 1}]


def test_sqlalchemy_connection(db_url):
    engine = sa.create_engine(sqlalchemy_url(db_url))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("SELECT 1"))
            first = enqueue(conn, request(step_id="sa"), policy=POLICY)
        with pytest.raises(RuntimeError), engine.begin() as conn:
            enqueue(conn, request(step_id="sa-2"), policy=POLICY)
            raise RuntimeError("rollback")
    finally:
        engine.dispose()
    assert first.created and count(db_url) == (1, 1)


async def test_async_psycopg_and_sqlalchemy(db_url):
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        async with conn.transaction():
            a = await enqueue_async(conn, request(step_id="async"), policy=POLICY)
    engine = create_async_engine(sqlalchemy_url(db_url))
    try:
        async with engine.begin() as conn:
            b = await enqueue_async(conn, request(step_id="async-sa"), policy=POLICY)
    finally:
        await engine.dispose()
    assert a.created and b.created and count(db_url) == (2, 2)


def test_invalid_and_conflicting_requests_write_nothing_in_the_callers_transaction(db_url):
    req = request(step_id="x")
    enqueue_own(db_url, req, policy=POLICY)
    with psycopg.connect(db_url) as conn:
        with pytest.raises(InvalidRequest):
            enqueue(conn, {**req, "to": []}, policy=POLICY)
        with pytest.raises(IdempotencyConflict):
            enqueue(conn, {**req, "text": "different"}, policy=POLICY)
        assert enqueue(conn, req, policy=POLICY).created is False
        conn.commit()
    assert count(db_url) == (1, 1)


def test_rejects_connections_it_cannot_use(db_url):
    with pytest.raises(TypeError, match="psycopg"):
        enqueue(object(), request(), policy=POLICY)


def test_no_caller_of_the_python_api_can_send_as_evqs_notice_sender(db_url):
    """The default policy reserves the notice sender: a forged notice is refused, nothing is written."""
    forged = request(step_id="forged", **{"from": "evq-notices@example.org"})
    with psycopg.connect(db_url) as conn, conn.transaction():
        with pytest.raises(InvalidRequest) as refused:
            enqueue(conn, forged)
    [error] = refused.value.errors
    assert error["field"] == "from" and "reserved" in error["message"]
    with pytest.raises(InvalidRequest):
        enqueue_own(db_url, forged)
    assert count(db_url) == (0, 0)


def test_enqueue_own_records_its_refusals_and_enqueue_in_a_transaction_does_not(db_url):
    from dataclasses import replace

    policy = replace(POLICY, require_provenance=("model",))
    with pytest.raises(InvalidRequest) as caught:
        enqueue_own(db_url, request(run_id="run-own", decision=None), policy=policy)
    assert [e["field"] for e in caught.value.errors] == ["decision.model"]
    [row] = rows(db_url, "SELECT interface, key_name, reasons, asked FROM enqueue_refusals")
    assert (row["interface"], row["key_name"], row["reasons"]) == ("python", None, ["decision"])
    assert row["asked"][0]["run_id"] == "run-own"
    with pytest.raises(InvalidRequest):
        enqueue_own(db_url, request(decision=None), policy=policy, record_refusals=False)
    # Inside the caller's transaction nothing is written, not even the refusal (see enqueue_own's docstring).
    with psycopg.connect(db_url) as conn, conn.transaction(), pytest.raises(InvalidRequest):
        enqueue(conn, request(decision=None), policy=policy)
    assert rows(db_url, "SELECT count(*) AS n FROM enqueue_refusals")[0]["n"] == 1
    assert rows(db_url, "SELECT total FROM enqueue_refusal_counts") == [{"total": 1}]
