"""The step guard's approval exception, for real (evq_step_guard): the runtime role may
change a step's payload only as a held step is approved with the agent's hash kept in
requested_sha256, never put a step back to held, and the store's own approve (with a
correction) passes the guard as the runtime role."""

from __future__ import annotations

import psycopg
import pytest

from evq.adapters.postgres.store import PostgresStore
from evq.worker.approval_actions import edited
from tests.database_roles import migrated
from tests.support import POLICY, execute, rows, valid

# Each one a runtime-role UPDATE the guard must refuse (step 1 pending, step 2 held).
REWRITES = (
    # A pending step's request rewritten: what a step is is fixed at enqueue.
    "UPDATE email_steps SET payload = jsonb_set(payload, '{{subject}}', '\"x\"') WHERE id = {pending}",
    "UPDATE email_steps SET payload_sha256 = repeat('a', 64) WHERE id = {pending}",
    "UPDATE email_steps SET requested_sha256 = payload_sha256 WHERE id = {pending}",
    # A held step's payload changed while it stays held.
    "UPDATE email_steps SET payload = jsonb_set(payload, '{{subject}}', '\"x\"'), payload_sha256 = repeat('b', 64), "
    "requested_sha256 = payload_sha256 WHERE id = {held}",
    # Approved with a changed payload, but the agent's hash not kept (or a made-up one).
    "UPDATE email_steps SET status = 'pending', held_since = NULL, payload_sha256 = repeat('c', 64) WHERE id = {held}",
    "UPDATE email_steps SET status = 'pending', held_since = NULL, payload_sha256 = repeat('c', 64), "
    "requested_sha256 = repeat('d', 64) WHERE id = {held}",
    # Put back to held: a send is held only at enqueue.
    "UPDATE email_steps SET status = 'held', held_since = now() WHERE id = {pending}",
)


def test_the_runtime_role_changes_a_payload_only_as_a_held_step_is_approved(roles):
    import asyncio

    r = roles
    migrated(r)

    async def setup() -> tuple[int, int]:
        store = await PostgresStore.open(r.app_url, max_size=1)
        try:
            pending = await store.enqueue(valid(run_id="r-g", step_id="p"))
            held = await store.enqueue(valid(run_id="r-g", step_id="h"))
            return pending.id, held.id
        finally:
            await store.close()

    pending, held = asyncio.run(setup())
    # Held as an approval policy's enqueue writes it (here by the owner, whom the guard lets through).
    execute(
        r.owner_url,
        "UPDATE email_steps SET status = 'held', reason = 'approval_required', held_since = now() WHERE id = %s",
        (held,),
    )
    execute(r.owner_url, "DELETE FROM step_queue WHERE id = %s", (held,))
    went_through = []
    for sql in REWRITES:
        with psycopg.connect(r.app_url) as conn:
            try:
                if conn.execute(sql.format(pending=pending, held=held)).rowcount:
                    went_through.append(sql)
            except psycopg.errors.CheckViolation:
                conn.rollback()
    assert went_through == [], went_through
    before = rows(r.admin_url, "SELECT payload, payload_sha256 FROM email_steps WHERE id = %s", (held,))[0]

    async def approve() -> None:
        store = await PostgresStore.open(r.app_url, max_size=1)
        try:
            edit = edited(
                before["payload"], "smtp", {"subject": "Corrected"}, POLICY, from_sha256=before["payload_sha256"]
            )
            await store.approve(held, actor="ada", actor_key_id="k-ada", note="typo", edit=edit)
        finally:
            await store.close()

    asyncio.run(approve())
    [after] = rows(r.admin_url, "SELECT * FROM email_steps WHERE id = %s", (held,))
    assert after["status"] == "pending" and after["payload"]["subject"] == "Corrected"
    assert after["requested_sha256"] == before["payload_sha256"] != after["payload_sha256"]
    # Approved once: a second correction, now that it is pending, is refused.
    with psycopg.connect(r.app_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE email_steps SET payload = jsonb_set(payload, '{subject}', '\"again\"') WHERE id = %s", (held,)
        )
