"""The key ledger (invariant 12) against the PostgreSQL store: a key whose step evq prune removed is
answered as the step ended, never enqueued again; another request under it is a conflict; its
id says it was pruned; and a failure notice pruned while its step was requeued is not made twice."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.errors import IdempotencyConflict, NotFound
from evq.worker.notices import NoticeConfig
from evq.worker.outcomes import Accepted, Retryable
from evq.worker.ports import StepFilter
from evq.worker.resolution import Resolution
from evq.worker.states import Status
from tests.conformance.helpers import claim, kinds, settle
from tests.support import valid

PAST = datetime(2020, 1, 1, tzinfo=UTC)  # the prune refuses a cutoff after the clock


def at(hours: float) -> datetime:
    return PAST + timedelta(hours=hours)


async def prune(store, cutoff: datetime) -> int:
    return (await store.prune_batch(cutoff=cutoff, limit=100, actor="admin", run=uuid.uuid4(), batch=1)).steps


async def all_steps(store) -> list:
    return (await store.list_steps(StepFilter(limit=None)))[0]


async def test_a_pruned_key_is_answered_as_its_step_ended_and_never_enqueued_again(store):
    sent = valid(run_id="r", step_id="welcome")
    first = await store.enqueue(sent, now=at(0))
    [step] = await claim(store, now=at(0))
    await store.record([settle(step, Accepted("pm-1"))], actor="w", now=at(0))
    assert await prune(store, at(1)) == 1 and await all_steps(store) == []

    again = await store.enqueue(sent, now=at(2))
    assert await all_steps(store) == []  # nothing was enqueued
    assert (again.id, again.message_id, again.status, again.created) == (
        first.id,
        first.message_id,
        Status.ACCEPTED,
        False,
    )
    assert again.pruned is True
    assert (await store.find_by_key(sent))["pruned"] is True
    [batch_again] = await store.enqueue_many([sent], now=at(2))
    assert (batch_again.id, batch_again.created, batch_again.pruned) == (first.id, False, True)
    assert await all_steps(store) == []

    # The same key (or its run and step ids under it) with another request: refused, as for a stored step.
    with pytest.raises(IdempotencyConflict) as refused:
        await store.enqueue(valid(run_id="r", step_id="welcome", subject="something else"), now=at(2))
    assert refused.value.context == {"existing_id": first.id, "idempotency_key": "r:welcome", "pruned": True}
    with pytest.raises(IdempotencyConflict):
        await store.enqueue(valid(run_id="r", step_id="welcome", provider="null"), now=at(2))
    assert await all_steps(store) == []

    with pytest.raises(NotFound) as gone:
        await store.get_step(first.id)
    context = gone.value.context
    assert (context["pruned"], context["status"], context["message_id"]) == (True, "accepted", first.message_id)
    assert "pruned" in gone.value.message
    with pytest.raises(NotFound) as never:
        await store.get_step(first.id + 1000)
    assert never.value.context == {}


async def test_a_notice_pruned_while_its_step_was_requeued_is_not_made_again(store):
    """A dead letter (attempts spent) tells its notify address once; an operator requeues it, the
    notice (sent, closed) is pruned on its own, the step fails again: the same notice's key comes
    back, and the ledger still holds it. One notice per step and kind, pruned or not."""
    store.notices = NoticeConfig()
    e = await store.enqueue(valid(max_attempts=1, notify="owner@example.com"), now=at(0))
    [step] = await claim(store, now=at(0))
    await store.record([settle(step, Retryable("451 later"))], actor="w", now=at(0))
    [notice] = [s for s in await all_steps(store) if s.id != e.id]
    [sent] = [c for c in await claim(store, now=at(1)) if c.id == notice.id]
    await store.record([settle(sent, Accepted("pm-notice"))], actor="w", now=at(1))
    await store.resolve(
        e.id, Resolution.parse("retry", "requeue it"), actor="operator:ada", default_max_attempts=1, now=at(2)
    )
    assert await prune(store, at(3)) == 1  # the notice alone: its step is open again
    [step] = await claim(store, now=at(4))
    await store.record([settle(step, Retryable("451 later"))], actor="w", now=at(4))

    assert [s.id for s in await all_steps(store)] == [e.id]
    assert (await kinds(store, e.id)).count("notice_enqueued") == 1
