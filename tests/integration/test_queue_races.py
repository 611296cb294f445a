"""Operator actions racing the queue (issue 31's review): a statement that reads a step's queue row
from its snapshot cannot see, nor lock, a queue row an approval or an operator's requeue inserted
after that snapshot, while the claim, which reads email_steps without a lock, can take that row the
moment the approval commits. Each race is staged with explicit transactions, in the real database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.rows import dict_row

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store import PostgresStore
from evq.worker.errors import StateConflict
from evq.worker.resolution import Resolution
from tests.support import held_steps, rows, step_row, unknown_steps, valid, wait_for_lock_waiters

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
T1 = datetime(2030, 1, 1, 15, 0, tzinfo=UTC)


def _approve_params(step_id: int) -> dict:
    return {
        "now": T1,
        "id": step_id,
        "actor": "approver",
        "actor_key_id": "someone-else",
        "note": "ok",
        "payload": None,
        "payload_sha256": None,
        "from_sha256": None,
        "fields": "[]",
    }


def _resolve_params(step_id: int) -> dict:
    r = Resolution.parse("retry", "provider log shows nothing")
    return {
        "now": T1,
        "id": step_id,
        "to_status": str(r.verdict.to_status),
        "verdict": str(r.verdict),
        "note": r.note,
        "reason": r.reason,
        "provider_message_id": None,
        "evidence_url": None,
        "actor": "operator",
        "default_max_attempts": 3,
        "deadline_share": 0.5,
    }


async def _cancel_while_requeued(store: PostgresStore, db_url: str, step_id: int, requeue_sql: str, params: dict):
    """The requeue (approval, or an operator's retry) holds the step's row; a cancel waits for it; the
    requeue commits; a worker claims while the cancel's transaction is still open (it writes the notice
    next); then the cancel commits. Returns what the claim got and whether the cancel changed the step."""
    requeue = await psycopg.AsyncConnection.connect(db_url, application_name="evq", row_factory=dict_row)
    cancel = await psycopg.AsyncConnection.connect(db_url, application_name="evq", row_factory=dict_row)
    try:
        await requeue.execute(requeue_sql, params)  # its transaction is open: the step's row is locked
        cancelled = asyncio.create_task(
            cancel.execute(Q["step_cancel"], {"now": T1, "id": step_id, "actor": "agent", "note": "stop"})
        )
        await asyncio.to_thread(wait_for_lock_waiters, db_url, 1)
        await requeue.commit()
        cur = await cancelled
        [row] = await cur.fetchall()
        # The cancel's transaction is still open: a worker, woken by the requeue's notify, claims.
        # Its attempt_started evidence's foreign key check waits for the cancel to commit, but
        # the step was taken from the claim's snapshot, where the cancel had not happened.
        claiming = asyncio.create_task(
            store.claim(owner="w-race", providers=["smtp"], limit=10, lease_seconds=60, dedupe_windows={}, now=T1)
        )
        # The claim has its snapshot once it waits on the cancel's lock (its evidence's key check).
        await asyncio.to_thread(wait_for_lock_waiters, db_url, 1)
        await cancel.commit()
        claimed = await claiming
    finally:
        await requeue.close()
        await cancel.close()
    return claimed, row


async def _assert_never_both(store: PostgresStore, db_url: str, step_id: int, claimed, row) -> None:
    got = [c for c in claimed if c.id == step_id]
    # A send a cancel reported as cancelled must never be handed to a worker, and a claimed one
    # is in flight: the cancel must not have closed it.
    assert not (got and row["changed"]), (
        f"step {step_id} was claimed (attempt {got[0].attempt if got else None}) and its cancel succeeded: "
        f"{step_row(db_url, step_id)['status']}, queue row {rows(db_url, 'SELECT * FROM step_queue WHERE id = %s', (step_id,))}"
    )
    # Whatever won, email_steps and step_queue agree: a closed step has no queue row.
    now = step_row(db_url, step_id)
    queue = rows(db_url, "SELECT * FROM step_queue WHERE id = %s", (step_id,))
    if now["status"] in ("accepted", "rejected", "unknown", "held"):
        assert queue == [], f"closed step {step_id} ({now['status']}) keeps its queue row {queue}"
    else:
        assert len(queue) == 1


async def test_cancel_racing_an_approval_never_cancels_a_send_a_worker_claims(store, db_url):
    [step] = await held_steps(store, now=T0)
    claimed, row = await _cancel_while_requeued(store, db_url, step.id, Q["step_approve"], _approve_params(step.id))
    await _assert_never_both(store, db_url, step.id, claimed, row)


async def test_cancel_racing_an_operator_requeue_never_cancels_a_send_a_worker_claims(store, db_url):
    [step] = await unknown_steps(store, now=T0)
    claimed, row = await _cancel_while_requeued(store, db_url, step.id, Q["step_resolve"], _resolve_params(step.id))
    await _assert_never_both(store, db_url, step.id, claimed, row)


async def test_cancel_through_the_store_after_a_racing_approval_cancels_or_says_in_flight(store, db_url):
    """The store's cancel, racing an approval: it either cancels the step (and no worker can claim
    it afterwards) or refuses with a conflict; never both."""
    [step] = await held_steps(store, now=T0)
    requeue = await psycopg.AsyncConnection.connect(db_url, application_name="evq", row_factory=dict_row)
    try:
        await requeue.execute(Q["step_approve"], _approve_params(step.id))
        cancelled = asyncio.create_task(store.cancel(step.id, actor="agent", note="stop", now=T1))
        await asyncio.to_thread(wait_for_lock_waiters, db_url, 1)
        await requeue.commit()
        outcome = await asyncio.gather(cancelled, return_exceptions=True)
    finally:
        await requeue.close()
    # Before any claim: a cancelled step keeps no queue row (the requeue's was inserted after the
    # cancel's first snapshot; only a cancel that locks it, from a later snapshot, removes it).
    queue = rows(db_url, "SELECT * FROM step_queue WHERE id = %s", (step.id,))
    if not isinstance(outcome[0], BaseException):
        assert queue == [], f"cancelled step {step.id} keeps its queue row {queue}"
    claimed = await store.claim(
        owner="w-race", providers=["smtp"], limit=10, lease_seconds=60, dedupe_windows={}, now=T1
    )
    if isinstance(outcome[0], BaseException):
        assert isinstance(outcome[0], StateConflict)
    else:
        assert step_row(db_url, step.id)["status"] == "rejected"
        assert [c.id for c in claimed if c.id == step.id] == []
        assert rows(db_url, "SELECT * FROM step_queue WHERE id = %s", (step.id,)) == []


async def test_a_late_answer_racing_an_operator_requeue_never_closes_a_step_a_worker_claims(store, db_url):
    """A worker's answer arrives late (its lease expired, the rescuer made the step unknown) just as an
    operator requeues the step: the late answer's statement waits for the step's row, whose new queue
    row it cannot see; a worker claims that row before the late answer commits. The late answer must not
    close the step (accepted) under the attempt now going out, which would leave a closed step with a
    leased queue row (shown in flight, and a CHECK violation for the rescuer when that lease expires)."""
    from evq.adapters.postgres.store.queue import _transitions_json
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Accepted
    from evq.worker.transitions import decide

    lease = 60.0
    made = await store.enqueue(valid(), now=T0)
    [first] = await store.claim(
        owner="w-slow", providers=["smtp"], limit=1, lease_seconds=lease, dedupe_windows={}, now=T0
    )
    later = T0 + timedelta(seconds=lease + 1)
    rescued = await store.rescue(limit=10, lease_seconds=lease, default_max_attempts=3, actor="r", now=later)
    assert rescued.unknown == 1
    answer = decide(first, Accepted("pm-late"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)

    requeue = await psycopg.AsyncConnection.connect(db_url, application_name="evq", row_factory=dict_row)
    late = await psycopg.AsyncConnection.connect(db_url, application_name="evq", row_factory=dict_row)
    try:
        await requeue.execute(Q["step_resolve"], _resolve_params(made.id))  # T1: past the retry guard
        answering = asyncio.create_task(
            late.execute(
                Q["step_record_late"], {"transitions": _transitions_json([answer]), "actor": "w-slow", "now": T1}
            )
        )
        await asyncio.to_thread(wait_for_lock_waiters, db_url, 1)
        await requeue.commit()
        [late_row] = await (await answering).fetchall()
        claiming = asyncio.create_task(
            store.claim(owner="w-next", providers=["smtp"], limit=10, lease_seconds=lease, dedupe_windows={}, now=T1)
        )
        await asyncio.to_thread(wait_for_lock_waiters, db_url, 1)
        await late.commit()
        claimed = await claiming
    finally:
        await requeue.close()
        await late.close()
    now = step_row(db_url, made.id)
    queue = rows(db_url, "SELECT * FROM step_queue WHERE id = %s", (made.id,))
    in_flight = [c for c in claimed if c.id == made.id]
    assert not (in_flight and late_row["settled"]), (
        f"the late answer closed step {made.id} ({now['status']}) while attempt {in_flight[0].attempt} "
        f"was claimed; queue row {queue}"
    )
    if now["status"] in ("accepted", "rejected", "unknown"):
        assert queue == []
    # The attempt under way, if any, can still be rescued when its lease expires.
    await store.rescue(
        limit=10, lease_seconds=lease, default_max_attempts=3, actor="r", now=T1 + timedelta(seconds=lease + 1)
    )
