"""The step guards' WHEN conditions (migration 0024), for real as the runtime role: a claim and
a recorded answer update their steps without calling either guard function (the saving), and
every kind of update a guard refuses still calls it and is refused (the guarantee)."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store import PostgresStore
from tests.database_roles import migrated
from tests.support import execute, valid

GUARDS = ("evq_step_guard", "evq_content_guard")

# One per refusal the two functions make (0012, 0013, 0018), each an update the WHEN
# conditions must hand to the function.
REFUSED = (
    "UPDATE email_steps SET message_id = '<forged@example.com>' WHERE id = {accepted}",
    "UPDATE email_steps SET notify = 'https://forged.example/' WHERE id = {accepted}",
    'UPDATE email_steps SET payload = payload || \'{{"subject": "rewritten"}}\' WHERE id = {accepted}',
    "UPDATE email_steps SET status = 'pending', closed_at = NULL WHERE id = {accepted}",
    "UPDATE email_steps SET status = 'held', held_since = now() WHERE id = {pending}",
    "UPDATE email_steps SET content_redacted_at = now() WHERE id = {accepted}",
)


def calls(conn: psycopg.Connection) -> dict[str, int]:
    return dict(
        conn.execute(
            "SELECT funcname, calls FROM pg_stat_xact_user_functions WHERE funcname = ANY(%s)", (list(GUARDS),)
        ).fetchall()
    )


def test_claims_and_answers_skip_the_guards_and_every_refusal_still_reaches_them(roles):
    r = roles
    migrated(r)
    # Function calls counted for the runtime role's sessions (a superuser-only setting).
    execute(r.admin_url, f"ALTER ROLE \"{r.app}\" SET track_functions = 'all'")

    async def enqueue() -> list[int]:
        store = await PostgresStore.open(r.app_url, max_size=1)
        try:
            return [(await store.enqueue(valid(run_id="r-w", step_id=f"s{i}"))).id for i in range(3)]
        finally:
            await store.close()

    ids = asyncio.run(enqueue())
    with psycopg.connect(r.app_url) as conn:
        claimed = conn.execute(
            Q["step_claim"],
            {
                "now": None,
                "claim_id": "guards",
                "probe": False,
                "owner": "w1",
                "providers": ["smtp"],
                "limit": 2,
                "lease_seconds": 60.0,
                "dedupe_windows": json.dumps({}),
            },
        ).fetchall()
        assert [row[0] for row in claimed] == ids[:2]
        transitions = [
            {
                "id": row[0],
                "lease_token": str(row[9]),
                "attempt": row[7],
                "to_status": "accepted",
                "reason": "accepted",
                "outcome": "accepted",
                "provider_message_id": None,
                "retry_delay": None,
                "maybe_delivered": True,
                "latency_ms": 1.0,
                "detail": {},
                "message": "250 ok",
                "charged": True,
            }
            for row in claimed
        ]
        [(fenced,)] = conn.execute(
            Q["step_record"], {"now": None, "transitions": json.dumps(transitions), "actor": "w1"}
        ).fetchall()
        assert fenced == []
        # Two rows claimed and answered: four updates, no guard called.
        assert calls(conn) == {}
        conn.commit()

    accepted, pending = ids[0], ids[2]
    for sql in REFUSED:
        with psycopg.connect(r.app_url) as conn:
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(sql.format(accepted=accepted, pending=pending))
            conn.rollback()


def test_a_temporary_pg_class_does_not_pass_the_runtime_role_off_as_the_owner(roles):
    """Both guards ask ``pg_class`` (unqualified) who owns ``email_steps`` and let the owner
    through. A temporary table is searched before pg_catalog unless the search path names
    pg_temp, so a runtime role (which has TEMP on the database) could create its own
    ``pg_class`` saying it owns the table and then rewrite or reopen any step, whatever the
    triggers' WHEN conditions hand to the functions."""
    r = roles
    migrated(r)

    async def enqueue() -> list[int]:
        store = await PostgresStore.open(r.app_url, max_size=1)
        try:
            return [(await store.enqueue(valid(run_id="r-t", step_id=f"s{i}"))).id for i in range(2)]
        finally:
            await store.close()

    accepted, pending = asyncio.run(enqueue())
    execute(r.owner_url, "UPDATE email_steps SET status = 'accepted', closed_at = now() WHERE id = %s", (accepted,))
    for sql in REFUSED:
        with psycopg.connect(r.app_url) as conn:
            conn.execute("CREATE TEMP TABLE pg_class (oid oid, relname name, relowner oid)")
            conn.execute(
                "INSERT INTO pg_temp.pg_class SELECT 'email_steps'::regclass, 'email_steps', oid "
                "FROM pg_roles WHERE rolname = current_user"
            )
            with pytest.raises(psycopg.errors.CheckViolation, match="evq: step"):
                conn.execute(sql.format(accepted=accepted, pending=pending))
            conn.rollback()
