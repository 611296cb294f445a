"""The step guards' WHEN conditions (migrations/baseline/guards.sql), for real as the runtime role: a claim and
a recorded answer update their steps without calling either guard function (the saving), and
every kind of update a guard refuses still calls it and is refused (the guarantee)."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store import PostgresStore
from evq.adapters.postgres.store.queue import _transitions_json
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted, Outcome, Rejected
from evq.worker.records import ClaimedStep
from evq.worker.transitions import decide
from tests.database_roles import migrated
from tests.support import execute, rows, valid

GUARDS = ("evq_step_guard", "evq_content_guard")

# One per refusal the two functions make, each an update the WHEN
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


def enqueued(url: str, run_id: str, n: int) -> list[int]:
    """``n`` steps enqueued by the runtime role through the store; their ids in order."""

    async def enqueue() -> list[int]:
        store = await PostgresStore.open(url, max_size=1)
        try:
            return [(await store.enqueue(valid(run_id=run_id, step_id=f"s{i}"))).id for i in range(n)]
        finally:
            await store.close()

    return asyncio.run(enqueue())


def claim_and_answer(conn: psycopg.Connection, *, limit: int, outcome: Outcome) -> list[int]:
    """The worker's own two statements in one transaction (so the transaction's function counts
    cover both): claim up to ``limit`` steps and record ``outcome`` for each, built and encoded
    as the worker and the store do; the ids claimed."""
    claimed = [
        ClaimedStep(*row)
        for row in conn.execute(
            Q["step_claim"],
            {
                "now": None,
                "claim_id": f"guards-{type(outcome).__name__}",
                "probe": False,
                "owner": "w1",
                "providers": ["smtp"],
                "limit": limit,
                "lease_seconds": 60.0,
                "dedupe_windows": json.dumps({}),
            },
        ).fetchall()
    ]
    settled = [
        decide(c, outcome, default_max_attempts=3, backoff=Backoff(60, 60), dedupe_window_open=False, latency_ms=1.0)
        for c in claimed
    ]
    [(fenced,)] = conn.execute(
        Q["step_record"], {"now": None, "transitions": _transitions_json(settled), "actor": "w1"}
    ).fetchall()
    assert fenced == []
    return [c.id for c in claimed]


def test_claims_and_answers_skip_the_guards_and_every_refusal_still_reaches_them(roles):
    r = roles
    migrated(r)
    # Function calls counted for the runtime role's sessions (a superuser-only setting).
    execute(r.admin_url, f"ALTER ROLE \"{r.app}\" SET track_functions = 'all'")

    ids = enqueued(r.app_url, "r-w", 3)
    with psycopg.connect(r.app_url) as conn:
        claimed = claim_and_answer(conn, limit=2, outcome=Accepted("m1"))
        assert claimed == ids[:2]
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

    accepted, pending = enqueued(r.app_url, "r-t", 2)
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


# Every column and status rule the functions check, not one example of each kind: a WHEN
# condition that dropped any of them let REFUSED above pass (review24 mutated the condition
# to omit payload_sha256, requested_sha256, the rejected rule and the redacted step's status
# rule, and the test above still passed). The message is matched because check constraints
# raise the same SQLSTATE as the guards.
EVERY_REFUSAL = (
    *(
        f"UPDATE email_steps SET {column} = {value} WHERE id = {{accepted}}"
        for column, value in (
            ("id", "id + 1000"),
            ("run_id", "run_id || 'x'"),
            ("step_id", "step_id || 'x'"),
            ("decision_id", "(SELECT max(id) FROM decisions)"),
            ("idempotency_key", "idempotency_key || 'x'"),
            ("message_id", "'<forged@example.com>'"),
            ("provider", "'other'"),
            ("notify", "'https://forged.example/'"),
            ("created_at", "created_at - interval '1 day'"),
            ("payload", 'payload || \'{{"subject": "rewritten"}}\''),
            ("payload_sha256", "repeat('0', 64)"),
            ("requested_sha256", "repeat('0', 64)"),
        )
    ),
    "UPDATE email_steps SET status = 'pending', closed_at = NULL WHERE id = {accepted}",
    "UPDATE email_steps SET status = 'pending', closed_at = NULL WHERE id = {rejected}",
    "UPDATE email_steps SET status = 'held', held_since = now() WHERE id = {pending}",
    "UPDATE email_steps SET content_redacted_at = now() WHERE id = {accepted}",
    "UPDATE email_steps SET content_redacted_at = NULL WHERE id = {redacted}",
    "UPDATE email_steps SET status = 'retryable', closed_at = NULL WHERE id = {redacted}",
)


def test_every_refusal_of_either_guard_still_reaches_it(roles):
    r = roles
    migrated(r)

    accepted, rejected, redacted, pending = enqueued(r.app_url, "r-e", 4)
    with psycopg.connect(r.owner_url) as conn:  # the owner passes the guards
        conn.execute("UPDATE email_steps SET status = 'accepted', closed_at = now() WHERE id = %s", (accepted,))
        conn.execute(
            "UPDATE email_steps SET status = 'rejected', reason = 'attempts_exhausted', closed_at = now() "
            "WHERE id = ANY(%s)",
            ([rejected, redacted],),
        )
        conn.execute("UPDATE email_steps SET content_redacted_at = now() WHERE id = %s", (redacted,))
    ids = {"accepted": accepted, "rejected": rejected, "redacted": redacted, "pending": pending}
    for sql in EVERY_REFUSAL:
        with psycopg.connect(r.app_url) as conn:
            with pytest.raises(psycopg.errors.CheckViolation, match=r"^evq: step"):
                conn.execute(sql.format(**ids))
            conn.rollback()


def test_a_temporary_key_events_does_not_swallow_the_sessions_events(roles):
    """evq_key_event once wrote to an unqualified ``key_events``: a runtime-role session with a
    temporary table of that name would have had its rejections recorded there, out of every
    agent's sight (``evq events list``, callbacks). With its own search path the real table gets it."""
    r = roles
    migrated(r)

    [step] = enqueued(r.app_url, "r-k", 1)
    with psycopg.connect(r.app_url) as conn:
        conn.execute("CREATE TEMP TABLE key_events (LIKE public.key_events INCLUDING DEFAULTS)")
        assert claim_and_answer(conn, limit=1, outcome=Rejected("550 no such user")) == [step]
        [(shadowed,)] = conn.execute("SELECT count(*) FROM pg_temp.key_events").fetchall()
        conn.commit()
    assert shadowed == 0
    events = rows(r.admin_url, "SELECT kind, status FROM key_events WHERE step = %s", (step,))
    assert events == [{"kind": "rejected", "status": "rejected"}]
