"""An operator's retry of a rescued row waits until the rescued attempt cannot still be
going out (its lease plus the adapter's whole deadline), in the real database with its
clock injected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.errors import StateConflict
from tests.integration.test_resolve import verdict
from tests.support import evidence_kinds, step_row, unknown_steps, valid

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = 40.0  # seconds; the adapter's whole deadline is 0.75 of it (worker/deadline.py)
POSSIBLE_AT = T0 + timedelta(seconds=LEASE + 0.75 * LEASE)


async def rescued(store) -> int:
    made = await store.enqueue(valid(), now=T0)
    [claimed] = await store.claim(
        owner="paused-worker", providers=["smtp"], limit=1, lease_seconds=LEASE, dedupe_windows={}, now=T0
    )
    counts = await store.rescue(
        limit=10, lease_seconds=LEASE, default_max_attempts=3, actor="rescuer", now=T0 + timedelta(seconds=LEASE + 1)
    )
    assert counts.total == 1 and claimed.id == made.id
    return made.id


async def resolve_at(store, step_id: int, at: datetime, kind: str = "retry"):
    return await store.resolve(
        step_id, verdict(kind, "not in the provider's log"), actor="alice", default_max_attempts=3, now=at
    )


async def test_retry_of_a_rescued_row_is_refused_until_the_attempt_cannot_be_in_progress(store, db_url):
    step_id = await rescued(store)
    with pytest.raises(StateConflict) as refused:
        await resolve_at(store, step_id, POSSIBLE_AT - timedelta(seconds=1))
    error = refused.value
    assert error.context["retry_possible_at"] == POSSIBLE_AT.isoformat()
    assert error.context["retry_in_seconds"] == 1.0
    assert "may still be in progress" in error.message and POSSIBLE_AT.isoformat() in error.message
    # Refused means unchanged: still unknown, no operator evidence.
    assert step_row(db_url, step_id)["status"] == "unknown"
    assert evidence_kinds(db_url, step_id) == ["attempt_started", "lease_expired"]

    done = await resolve_at(store, step_id, POSSIBLE_AT + timedelta(seconds=1))
    assert done.to_status == "retryable"
    assert step_row(db_url, step_id)["status"] == "retryable"


async def test_accepted_and_rejected_verdicts_of_a_rescued_row_need_no_wait(store, db_url):
    step_id = await rescued(store)
    done = await resolve_at(store, step_id, T0 + timedelta(seconds=LEASE + 2), kind="rejected")
    assert done.to_status == "rejected"


async def test_retry_of_an_unknown_row_that_was_not_rescued_needs_no_wait(store, db_url):
    [made] = await unknown_steps(store, now=T0)  # an ambiguous answer: the attempt is over
    done = await resolve_at(store, made.id, T0 + timedelta(seconds=1))
    assert done.to_status == "retryable"
