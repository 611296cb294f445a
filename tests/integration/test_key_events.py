"""Every failure reaches the agent that asked (issue 15): the key that enqueued a send
is recorded with its decision, and every rejection, unknown and verdict lands in that
key's event feed, whatever notices are configured."""

from __future__ import annotations

import psycopg

from evq.adapters.postgres.enqueue import enqueue
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.worker.keys import Role, generate
from tests.support import POLICY, request, rows


async def make_key(store, name: str, role: Role = Role.AGENT, created_by: str | None = "admin"):
    key = generate()
    await store.create_key(name=name, role=role, key=key, created_by=created_by)
    return key


async def test_the_key_that_enqueued_is_on_the_decision_and_the_enqueued_event(store, db_url):
    await make_key(store, "admin", Role.ADMIN, created_by=None)
    key = await make_key(store, "agent-7")
    reply = await service.enqueue(store, Caller(key.text, interface="http"), [request(run_id="r-actor")], POLICY)
    [decision] = rows(db_url, "SELECT actor, actor_key_id, interface FROM decisions WHERE run_id = 'r-actor'")
    assert decision == {"actor": "agent-7", "actor_key_id": key.key_id, "interface": "http"}
    shown = (await service.show_step(store, Caller(None, trusted_reader=True), reply.data["id"], unresolvable=())).data
    assert (shown["decision"]["actor"], shown["decision"]["actor_key_id"]) == ("agent-7", key.key_id)
    run = (await service.show_run(store, Caller(None, trusted_reader=True), "r-actor", unresolvable=())).data
    enqueued = next(e for e in run["events"] if e["kind"] == "enqueued")
    assert enqueued["actor"] == "agent-7"
    assert (enqueued["detail"]["actor_key_id"], enqueued["detail"]["interface"]) == (key.key_id, "http")
    # Never the secret, anywhere in the row.
    assert key.secret not in repr(rows(db_url, "SELECT * FROM decisions"))


def test_the_python_api_records_its_actor_string_and_no_key(db_url):
    with psycopg.connect(db_url) as conn, conn.transaction():
        enqueue(conn, request(run_id="r-py"), policy=POLICY, actor="billing-job")
        enqueue(conn, request(run_id="r-py"), policy=POLICY)
    assert rows(db_url, "SELECT actor, actor_key_id, interface FROM decisions WHERE run_id = 'r-py' ORDER BY id") == [
        {"actor": "billing-job", "actor_key_id": None, "interface": "python"},
        {"actor": None, "actor_key_id": None, "interface": "python"},
    ]
