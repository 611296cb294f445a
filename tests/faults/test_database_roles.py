"""History that cannot be rewritten, for real (invariant 11): an owner role migrates,
a runtime role runs everything else and cannot touch history.

Each test makes two roles of its own on the shared server (roles are cluster-wide:
names are unique per test and dropped in a finally) and a database owned by the
owner role, migrates it as the owner with ``evq db upgrade --runtime-role``, then
connects as the runtime role: every bypass of the append-only promise fails, and a
whole run (enqueue, a worker draining to a real SMTP server, resolve, keys, serve,
mcp, prune through the definer function) works.
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid

import httpx
import psycopg
import pytest

from evq.adapters.postgres.database import head_revision
from evq.ops.dev.smtp import DevSmtpServer
from tests.acceptance.conftest import Evq, make_key, smtp_env
from tests.database_roles import Roles, migrated, upgrade
from tests.support import request, rows, serve_process


def test_db_upgrade_refuses_a_role_that_does_not_own_the_schema(roles):
    r = roles
    # A fresh database: the runtime role may not create tables (PostgreSQL 15 gives
    # PUBLIC no CREATE on the public schema), and is told why before anything runs.
    error = upgrade(r.app_url, expect=4)["error"]
    assert error["code"] == "E_AUTH_FAILED" and r.app in error["message"] and "owner" in error["hint"], error
    assert rows(r.admin_url, "SELECT count(*) AS n FROM pg_tables WHERE schemaname = 'public'")[0]["n"] == 0

    migrated(r)
    # Nothing pending: the runtime role may check, and changes nothing...
    assert upgrade(r.app_url)["data"]["changed"] is False
    # ...but granting, or migrating a schema behind head (here 0.2.0's), is the owner's.
    error = upgrade(r.app_url, "--runtime-role", r.app, expect=4)["error"]
    assert r.owner in error["message"] and "does not own" in error["message"], error
    with psycopg.connect(r.owner_url) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0012_step_guard'")
    error = upgrade(r.app_url, expect=4)["error"]
    assert "does not own" in error["message"], error
    assert rows(r.admin_url, "SELECT version_num FROM alembic_version") == [{"version_num": "0012_step_guard"}]
    # A role that could act as the owner is refused as the runtime role.
    with psycopg.connect(r.owner_url) as conn:
        conn.execute("UPDATE alembic_version SET version_num = %s", (head_revision(),))
    error = upgrade(r.owner_url, "--runtime-role", r.owner, expect=2)["error"]
    assert error["code"] == "E_INVALID_ARG" and "rewrite history" in error["message"], error
    error = upgrade(r.owner_url, "--runtime-role", "no_such_role_" + uuid.uuid4().hex[:6], expect=2)["error"]
    assert "does not exist" in error["message"], error


# Every way the application's role could rewrite history if it owned the tables, or
# could flip the prune switch itself. Each runs in its own transaction as the runtime role.
BYPASSES = [
    ["ALTER TABLE evidence DISABLE TRIGGER ALL"],
    ["ALTER TABLE evidence DISABLE TRIGGER evidence_append_only"],
    ["DROP TRIGGER evidence_append_only ON evidence"],
    ["CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN OLD; END $$"],
    ["DROP FUNCTION evq_append_only() CASCADE"],
    ["DROP TABLE evidence"],
    ["DROP TABLE evidence CASCADE"],
    ["TRUNCATE evidence CASCADE"],
    ["TRUNCATE decisions CASCADE"],
    ["TRUNCATE prune_log"],
    ["TRUNCATE email_steps CASCADE"],
    ["UPDATE evidence SET actor = 'someone else'"],
    ["UPDATE decisions SET intent = 'rewritten'"],
    ["UPDATE prune_log SET steps = 0"],
    ["DELETE FROM evidence"],
    ["DELETE FROM decisions"],
    ["DELETE FROM prune_log"],
    # A provider circuit's history: appended with each change, never rewritten.
    ["UPDATE provider_circuit_events SET reason = 'rewritten'"],
    ["DELETE FROM provider_circuit_events"],
    ["TRUNCATE provider_circuit_events"],
    # Refused enqueues: what an agent tried stays as recorded; the counter never goes down.
    ["UPDATE enqueue_refusals SET key_name = 'someone else'"],
    ["DELETE FROM enqueue_refusal_counts"],
    ["TRUNCATE enqueue_refusals"],
    # Each key's event feed: appended by the evidence trigger, never rewritten.
    ["UPDATE key_events SET reason = 'rewritten'"],
    ["DELETE FROM key_events"],
    ["TRUNCATE key_events CASCADE"],
    ["ALTER TABLE evidence DISABLE TRIGGER evidence_key_events"],
    # Evidence partitions: the runtime role reads and writes them only through
    # evidence, and removes one only through evq_evidence_drop's checks.
    ["SELECT count(*) FROM evidence_steps_0"],
    ["INSERT INTO evidence_overflow (step_id, run_id, kind, actor) SELECT id, run_id, 'held', 'x' FROM email_steps"],
    ["DELETE FROM evidence_steps_0"],
    ["TRUNCATE evidence_steps_0"],
    ["TRUNCATE evidence_overflow"],
    ["DROP TABLE evidence_steps_0"],
    ["ALTER TABLE evidence DETACH PARTITION evidence_steps_0"],
    ["ALTER TABLE evidence_steps_0 DISABLE TRIGGER ALL"],
    ["DROP TRIGGER evidence_no_truncate ON evidence_steps_0"],
    ["CREATE TABLE evidence_forged PARTITION OF evidence FOR VALUES FROM (900000000) TO (900000010)"],
    ["DELETE FROM email_steps"],
    # The key ledger: insert-once by an enqueue, its end written only by evq_prune_batch,
    # never deleted; the runtime role may insert no end of its own.
    ["UPDATE step_keys SET status = 'rejected', closed_at = now(), pruned_at = now()"],
    ["UPDATE step_keys SET message_id = '<forged@example.com>'"],
    ["DELETE FROM step_keys"],
    ["TRUNCATE step_keys"],
    ["ALTER TABLE step_keys DISABLE TRIGGER ALL"],
    [
        "INSERT INTO step_keys (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256, "
        "created_at, status, closed_at, pruned_at) VALUES ('forged', 1, 'r', 's', '<f@x>', 'smtp', sha256('x'), "
        "now(), 'accepted', now(), now())"
    ],
    [
        "INSERT INTO prune_log (run, batch, actor, cutoff, steps, evidence, decisions) "
        "VALUES (gen_random_uuid(), 1, 'forged', now(), 0, 0, 0)"
    ],
    ["SET evq.pruning = on", "DELETE FROM evidence"],
    ["SELECT set_config('evq.pruning', 'on', true)", "DELETE FROM decisions"],
    [None, "DELETE FROM evidence"],  # GRANT itself first (a WARNING, no privilege), then delete
    ["ALTER TABLE evidence OWNER TO CURRENT_USER"],
    ["ALTER TABLE evidence ADD COLUMN forged text"],
    ["CREATE TABLE public.forged (id int)"],
    ["CREATE FUNCTION public.forged() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$"],
    ["CREATE TRIGGER forged BEFORE DELETE ON evidence FOR EACH ROW EXECUTE FUNCTION evq_append_only()"],
    [
        "CREATE OR REPLACE FUNCTION evq_prune_batch(timestamptz, integer, text, uuid, integer) "
        "RETURNS TABLE (pruned_steps integer, pruned_evidence integer, pruned_decisions integer) "
        "LANGUAGE sql AS $$ SELECT 0, 0, 0 $$"
    ],
    ["ALTER FUNCTION evq_prune_batch(timestamptz, integer, text, uuid, integer) OWNER TO CURRENT_USER"],
    ["ALTER FUNCTION evq_prune_batch(timestamptz, integer, text, uuid, integer) RESET ALL"],
    ["SELECT evq_grant_runtime(CURRENT_USER)"],
    ["CREATE SCHEMA forged"],
]


# What the runtime role could do with UPDATE on email_steps, were the rows not guarded.
STEP_REWRITES = [
    "UPDATE email_steps SET payload = payload || '{\"subject\": \"rewritten\"}' WHERE status = 'accepted'",
    "UPDATE email_steps SET message_id = '<forged@example.com>' WHERE status = 'accepted'",
    "UPDATE email_steps SET idempotency_key = idempotency_key || 'x' WHERE status = 'accepted'",
    "UPDATE email_steps SET run_id = 'elsewhere' WHERE status = 'accepted'",
    "UPDATE email_steps SET status = 'pending', closed_at = NULL, next_attempt_at = now() WHERE status = 'accepted'",
    "UPDATE email_steps SET status = 'unknown', closed_at = NULL, unknown_since = now() WHERE status = 'accepted'",
]


def history_state(url: str) -> dict:
    return rows(
        url,
        """
        SELECT (SELECT count(*) FROM evidence) AS evidence, (SELECT count(*) FROM decisions) AS decisions,
               (SELECT count(*) FROM prune_log) AS prune_log, (SELECT count(*) FROM email_steps) AS steps,
               (SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger
                 WHERE NOT tgisinternal) AS triggers,
               (SELECT md5(prosrc) FROM pg_proc WHERE proname = 'evq_append_only') AS append_only,
               (SELECT string_agg(tablename || ':' || tableowner, ',' ORDER BY tablename) FROM pg_tables
                 WHERE schemaname = 'public') AS tables,
               (SELECT md5(string_agg(e::text, ',' ORDER BY e.id)) FROM evidence e) AS evidence_digest,
               (SELECT md5(string_agg(k::text, ',' ORDER BY k.idempotency_key)) FROM step_keys k) AS ledger
        """,
    )[0]


def test_the_runtime_role_cannot_rewrite_history(roles):
    r = roles
    migrated(r)
    ran = run_as_runtime_role(r)  # history to protect, written by the runtime role itself
    assert ran["accepted"] >= 1 and history_state(r.admin_url)["prune_log"] >= 1
    before = history_state(r.admin_url)

    went_through = []
    for statements in BYPASSES:
        with psycopg.connect(r.app_url) as conn:
            try:
                for sql in statements:
                    conn.execute(sql or f'GRANT DELETE ON evidence TO "{r.app}"')
            except psycopg.errors.InsufficientPrivilege:
                conn.rollback()
                continue
            conn.rollback()
            went_through.append(statements)
    assert went_through == [], went_through
    # The runtime role updates steps (every transition is an UPDATE), but cannot rewrite what a
    # step is, nor reopen a closed one so that it is sent again (evq_step_guard).
    reopened = []
    for sql in STEP_REWRITES:
        with psycopg.connect(r.app_url) as conn:
            try:
                if conn.execute(sql).rowcount:
                    reopened.append(sql)
            except psycopg.errors.CheckViolation:
                conn.rollback()
    assert reopened == [], reopened
    # Pruning through the function is allowed, and bounded: terminal steps, a cutoff
    # no later than the database's clock, logged.
    with psycopg.connect(r.app_url) as conn, pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT * FROM evq_prune_batch(now() + interval '1 year', 1000, 'x', gen_random_uuid(), 1)")
    # A temporary table named like evq's cannot steer the definer function (fixed search_path).
    with psycopg.connect(r.app_url) as conn:
        conn.execute(
            "CREATE TEMP TABLE email_steps (id bigint, status text, created_at timestamptz, "
            "closed_at timestamptz, notice_of bigint, decision_id bigint)"
        )
        assert conn.execute("SELECT count(*) FROM email_steps").fetchone()[0] == 0  # the session sees its own
        [counts] = conn.execute("SELECT * FROM evq_prune_batch(now(), 1000, 'x', gen_random_uuid(), 1)").fetchall()
        conn.rollback()
    # It pruned the real table (the resolved step, closed before now()), not the empty temporary one.
    assert counts[0] == 1, counts
    assert history_state(r.admin_url) == before
    # A provider circuit: its state is the runtime's to change, its history only to append.
    [granted] = rows(
        r.admin_url,
        """
        SELECT has_table_privilege(%(app)s, 'provider_circuits', 'UPDATE') AS circuit_update,
               has_table_privilege(%(app)s, 'provider_circuit_events', 'INSERT') AS events_insert,
               has_table_privilege(%(app)s, 'provider_circuit_events', 'UPDATE') AS events_update,
               has_table_privilege(%(app)s, 'provider_circuit_events', 'DELETE') AS events_delete
        """,
        {"app": r.app},
    )
    assert granted == {"circuit_update": True, "events_insert": True, "events_update": False, "events_delete": False}
    # Refused enqueues: recorded and pruned, never rewritten; their counter only grows.
    [refusals] = rows(
        r.admin_url,
        """
        SELECT has_table_privilege(%(app)s, 'enqueue_refusals', 'INSERT') AS insert,
               has_table_privilege(%(app)s, 'enqueue_refusals', 'DELETE') AS prune,
               has_table_privilege(%(app)s, 'enqueue_refusals', 'UPDATE') AS rewrite,
               has_table_privilege(%(app)s, 'enqueue_refusal_counts', 'UPDATE') AS count,
               has_table_privilege(%(app)s, 'enqueue_refusal_counts', 'DELETE') AS uncount
        """,
        {"app": r.app},
    )
    assert refusals == {"insert": True, "prune": True, "rewrite": False, "count": True, "uncount": False}
    # The key ledger: an enqueue's columns only, and the prune (the owner's function) wrote
    # the end of each step it removed as the runtime role ran it.
    [ledger] = rows(
        r.admin_url,
        """
        SELECT has_any_column_privilege(%(app)s, 'step_keys', 'INSERT') AS enqueue,
               has_column_privilege(%(app)s, 'step_keys', 'idempotency_key', 'INSERT') AS key,
               has_column_privilege(%(app)s, 'step_keys', 'status', 'INSERT') AS own_end,
               has_column_privilege(%(app)s, 'step_keys', 'pruned_at', 'INSERT') AS own_prune,
               has_any_column_privilege(%(app)s, 'step_keys', 'UPDATE') AS rewrite,
               has_table_privilege(%(app)s, 'step_keys', 'DELETE') AS forget
        """,
        {"app": r.app},
    )
    assert ledger == {
        "enqueue": True,
        "key": True,
        "own_end": False,
        "own_prune": False,
        "rewrite": False,
        "forget": False,
    }
    ends = rows(r.admin_url, "SELECT step_id, status FROM step_keys WHERE pruned_at IS NOT NULL ORDER BY step_id")
    assert ends == [{"step_id": f"ok-{i}", "status": "accepted"} for i in range(3)]
    # A retry of a pruned request, as the runtime role: answered as it ended, nothing sent again.
    again = Evq(r.app_url, api_key=ran["admin"]).json(
        "steps", "enqueue", "--file", "-", input=json.dumps(ran["requests"]["ok-0"])
    )["data"]
    assert (again["created"], again["pruned"], again["status"]) == (False, True, "accepted")
    assert rows(r.admin_url, "SELECT count(*) AS n FROM email_steps WHERE step_id = 'ok-0'") == [{"n": 0}]
    # UPDATE is granted for the increment; a count that goes down is refused by its trigger.
    with psycopg.connect(r.app_url) as conn:
        conn.execute(
            "INSERT INTO enqueue_refusal_counts (interface, field, total) VALUES ('cli', 'to', 3) ON CONFLICT DO NOTHING"
        )
        conn.execute("UPDATE enqueue_refusal_counts SET total = total + 1 WHERE field = 'to'")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE enqueue_refusal_counts SET total = 0 WHERE field = 'to'")
        conn.rollback()
    # The queue is the runtime role's to write (every claim and answer does), but a queue row
    # made for a closed step never gets it sent: the claim takes only a step still pending or
    # retryable in email_steps, which the guard keeps closed.
    closed = {
        x["message_id"] for x in rows(r.admin_url, "SELECT message_id FROM email_steps WHERE closed_at IS NOT NULL")
    }
    with psycopg.connect(r.app_url) as conn:
        forged = conn.execute(
            "INSERT INTO step_queue (id, provider) SELECT id, provider FROM email_steps "
            "WHERE closed_at IS NOT NULL ON CONFLICT DO NOTHING"
        ).rowcount
    assert forged >= 1
    with DevSmtpServer() as smtp:
        done = Evq(r.app_url).run("worker", "run", "--drain", **smtp_env(smtp))
        assert done.returncode == 0, done.stderr[-3000:]
        assert not closed & set(smtp.by_message_id()), "a closed step was sent again"
    # The claim deleted the forged rows it took, unclaimed: nothing is left due for nothing.
    assert rows(r.admin_url, "SELECT count(*)::int AS n FROM step_queue") == [{"n": 0}]


def run_as_runtime_role(r: Roles) -> dict:
    """Enqueue, drain over real SMTP, resolve an unknown row, keys, serve, mcp and prune:
    all as the runtime role. Returns what the SMTP server received, counted."""
    admin = make_key(r.app_url, "admin", "admin", created_by=None)
    evq = Evq(r.app_url, api_key=admin)
    with DevSmtpServer() as smtp:
        asked = {f"ok-{i}": request(run_id="roles", step_id=f"ok-{i}") for i in range(3)}
        path_lines = [json.dumps(r) for r in asked.values()]
        path_lines.append(json.dumps(request(run_id="roles", step_id="lost", to=["lose-reply@example.com"])))
        sent = evq.json("enqueue", "--file", "-", input="\n".join(path_lines))
        assert sent["status"] == "success", sent
        done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
        assert done.returncode == 0, done.stderr[-3000:]
        received = smtp.by_message_id()
    steps = {s["step_id"]: s for s in rows(r.admin_url, "SELECT id, step_id, status, message_id FROM email_steps")}
    assert {k: v["status"] for k, v in steps.items()} == {
        "ok-0": "accepted",
        "ok-1": "accepted",
        "ok-2": "accepted",
        "lost": "unknown",
    }
    assert all(received.get(s["message_id"]) == 1 for s in steps.values()), received  # each once

    lost = steps["lost"]["id"]
    resolved = evq.json("steps", "resolve", str(lost), "--as", "accepted", "--note", "found in the provider's log")
    assert resolved["status"] == "success", resolved
    assert rows(r.admin_url, "SELECT status FROM email_steps WHERE id = %s", (lost,)) == [{"status": "accepted"}]

    agent = evq.json("keys", "create", "--name", "bot", "--role", "agent")["data"]
    assert agent["name"] == "bot" and evq.json("keys", "revoke", "bot")["status"] == "success"

    serve_as_runtime_role(r, admin, lost)
    mcp_as_runtime_role(r, admin)

    # Prune through evq_prune_batch: age the history (as the owner would not; the
    # server's superuser does it for the test), then the runtime role prunes it.
    with psycopg.connect(r.admin_url) as conn:
        conn.execute(
            "UPDATE email_steps SET created_at = now() - interval '100 days', "
            "closed_at = now() - interval '100 days' WHERE step_id LIKE 'ok-%'"
        )
    dry = evq.json("prune", "--older-than", "90d", "--dry-run")["data"]
    pruned = evq.json("prune", "--older-than", "90d")["data"]
    assert (pruned["steps"], pruned["evidence"]) == (dry["steps"], dry["evidence"]) and pruned["steps"] == 3
    assert rows(r.admin_url, "SELECT actor, steps FROM prune_log") == [{"actor": "admin", "steps": 3}]
    return {"accepted": 4, "received": received, "admin": admin, "requests": asked}


def serve_as_runtime_role(r: Roles, admin: str, step_id: int) -> None:
    with serve_process(r.app_url, timeout=60) as served:
        with httpx.Client(base_url=served.url, timeout=30) as web:
            auth = {"Authorization": f"Bearer {admin}"}
            made = web.post("/v1/steps", json=request(run_id="roles-http", step_id="http"), headers=auth)
            assert made.status_code == 201, made.text
            listed = web.get("/v1/steps", params={"run_id": "roles-http"}, headers=auth)
            assert listed.status_code == 200 and len(listed.json()["data"]) == 1, listed.text
            login = web.get("/ops/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', login.text)[1]
            signed_in = web.post("/ops/login", data={"csrf": csrf, "key": admin}, follow_redirects=True)
            assert signed_in.status_code == 200, signed_in.text[-500:]
            assert web.get("/ops/unknown").status_code == 200
            page = web.get(f"/ops/steps/{step_id}")
            assert page.status_code == 200 and "found in the provider" in page.text, page.text[-500:]
            # The queue gauges read as the runtime role too (a privilege the collector's query lacks
            # would read as evq_collector_up 0 on a page that still answers 200).
            metrics = web.get("/metrics")
            assert metrics.status_code == 200 and "\nevq_collector_up 1.0\n" in metrics.text, metrics.text[-2000:]
            assert re.search(r"^evq_evidence_partitions_ahead [1-9]", metrics.text, re.M), metrics.text[-2000:]


def mcp_as_runtime_role(r: Roles, admin: str) -> None:
    import asyncio

    from mcp import Client, StdioServerParameters

    env = {**os.environ, "EVQ_DATABASE_URL": r.app_url, "EVQ_API_KEY": admin, "EVQ_LOG_FORMAT": "json"}

    async def go() -> dict:
        params = StdioServerParameters(command=sys.executable, args=["-m", "tests.child", "mcp"], env=env)
        async with Client(params) as c:
            sent = await c.call_tool("evq_steps_enqueue", request(run_id="roles-mcp", step_id="mcp"))
            assert sent.structured_content["status"] == "success", sent.structured_content
            shown = await c.call_tool("evq_steps_show", {"step_id": sent.structured_content["data"]["id"]})
            return shown.structured_content

    shown = asyncio.run(go())
    assert shown["data"]["step"]["run_id"] == "roles-mcp", shown


def test_a_table_a_later_revision_adds_reaches_the_runtime_role_at_the_next_upgrade(roles):
    r = roles
    migrated(r)
    with psycopg.connect(r.owner_url) as conn:  # what a later revision's migration does
        conn.execute("CREATE TABLE later_state (id bigserial PRIMARY KEY, note text)")
    with psycopg.connect(r.app_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("INSERT INTO later_state (note) VALUES ('x')")
    # The next upgrade, without naming the role again, grants it what queue state needs.
    assert upgrade(r.owner_url)["data"]["runtime_roles"] == [r.app]
    with psycopg.connect(r.app_url) as conn:
        conn.execute("INSERT INTO later_state (note) VALUES ('x')")
        conn.execute("UPDATE later_state SET note = 'y'")
        conn.execute("DELETE FROM later_state")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DROP TABLE later_state")
