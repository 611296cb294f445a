"""Content retention under the runtime role: the worker's redactor works through
evq_redact_batch, which redacts closed steps past the cutoff and nothing else; the role itself
cannot change a payload, mark a step redacted, unmark one, or reopen a redacted step."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg

from evq.adapters.postgres.store import PostgresStore
from evq.worker.backoff import Backoff
from evq.worker.content_retention import Redactor, RedactorConfig
from evq.worker.outcomes import Accepted, Retryable
from evq.worker.transitions import decide
from tests.database_roles import migrated
from tests.support import rows, valid


async def _steps(url: str) -> dict[str, int]:
    """As the runtime role: two closed steps (one a dead letter) and an open one."""
    store = await PostgresStore.open(url, max_size=1)
    try:
        ok = (await store.enqueue(valid(run_id="r", step_id="ok", text="closed body"))).id
        dead = (await store.enqueue(valid(run_id="r", step_id="dead", text="dead body", max_attempts=1))).id
        claimed = await store.claim(owner="w", providers=["smtp"], limit=2, lease_seconds=60, dedupe_windows={})
        outcomes = {ok: Accepted("pm"), dead: Retryable("451")}
        await store.record(
            [
                decide(c, outcomes[c.id], default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
                for c in claimed
            ],
            actor="w",
        )
        waiting = (await store.enqueue(valid(run_id="r", step_id="open", text="open body"))).id
        return {"ok": ok, "dead": dead, "open": waiting}
    finally:
        await store.close()


async def _redact(url: str, keep: timedelta) -> int:
    store = await PostgresStore.open(url, max_size=1)
    try:
        return (await Redactor(store, RedactorConfig(keep=keep), actor="redactor@w").run_once()).redacted
    finally:
        await store.close()


def refused(url: str, sql: str) -> bool:
    with psycopg.connect(url) as conn:
        try:
            conn.execute(sql)
        except (psycopg.errors.CheckViolation, psycopg.errors.InvalidParameterValue):
            return True
        conn.rollback()
        return False


def test_the_runtime_role_redacts_only_through_the_function_and_only_closed_steps(roles):
    r = roles
    migrated(r)
    ids = asyncio.run(_steps(r.app_url))
    [grant] = rows(
        r.admin_url,
        "SELECT has_function_privilege(%(app)s, 'evq_redact_batch(interval, integer, text)', 'EXECUTE') AS app, "
        "(SELECT bool_or(a.grantee = 0) FROM pg_proc p, aclexplode(p.proacl) a "
        " WHERE p.proname = 'evq_redact_batch') AS public",
        {"app": r.app},
    )
    assert grant == {"app": True, "public": False}, grant
    # Before any redaction: the role cannot do it by hand, nor mark a step redacted.
    for sql in (
        "UPDATE email_steps SET payload = payload || '{\"text\": null}' WHERE status = 'accepted'",
        "UPDATE email_steps SET content_redacted_at = now() WHERE status = 'accepted'",
        "UPDATE email_steps SET content_redacted_at = now() WHERE status = 'pending'",
        "SELECT * FROM evq_redact_batch(interval '-1 day', 10, 'x')",  # a cutoff in the future
        "SELECT * FROM evq_redact_batch(interval '0', 0, 'x')",
    ):
        assert refused(r.app_url, sql), sql
    assert asyncio.run(_redact(r.app_url, timedelta(days=1))) == 0  # closed moments ago
    assert asyncio.run(_redact(r.app_url, timedelta(0))) == 2

    state = {
        x["id"]: x
        for x in rows(r.admin_url, "SELECT id, status, payload, content_redacted_at, payload_sha256 FROM email_steps")
    }
    assert state[ids["open"]]["payload"]["text"] == "open body" and state[ids["open"]]["content_redacted_at"] is None
    assert state[ids["ok"]]["payload"]["text"] is None and state[ids["ok"]]["content_redacted_at"] is not None
    assert state[ids["dead"]]["status"] == "rejected" and state[ids["dead"]]["payload"]["text"] is None
    # Once redacted: not unmarked, not given a body back, never reopened (a requeue would send nothing real).
    for sql in (
        f"UPDATE email_steps SET content_redacted_at = NULL WHERE id = {ids['ok']}",
        f'UPDATE email_steps SET payload = payload || \'{{"text": "forged"}}\' WHERE id = {ids["ok"]}',
        f"UPDATE email_steps SET status = 'retryable', reason = 'operator', closed_at = NULL WHERE id = {ids['dead']}",
    ):
        assert refused(r.app_url, sql), sql
    # The function redacts a step once, and the open one never.
    assert asyncio.run(_redact(r.app_url, timedelta(0))) == 0
    assert rows(
        r.admin_url, "SELECT kind, count(*) AS n FROM evidence WHERE kind = 'content_redacted' GROUP BY kind"
    ) == [{"kind": "content_redacted", "n": 2}]
    assert rows(r.admin_url, "SELECT payload->>'text' AS text FROM email_steps WHERE id = %s", (ids["open"],)) == [
        {"text": "open body"}
    ]


def test_a_temporary_table_cannot_steer_the_function(roles):
    r = roles
    migrated(r)
    ids = asyncio.run(_steps(r.app_url))
    with psycopg.connect(r.app_url) as conn:
        conn.execute(
            "CREATE TEMP TABLE email_steps (id bigint, status text, closed_at timestamptz, "
            "content_redacted_at timestamptz, payload jsonb)"
        )
        [done] = conn.execute("SELECT redacted FROM evq_redact_batch(interval '0', 10, 'x')").fetchone()
        conn.commit()
    assert done == 2  # the real table's closed steps (fixed search_path), not the empty temporary one
    assert rows(r.admin_url, "SELECT content_redacted_at FROM email_steps WHERE id = %s", (ids["open"],)) == [
        {"content_redacted_at": None}
    ]
