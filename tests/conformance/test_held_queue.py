"""The approval queue as the ops page reads it (`step_list`, docs/design.md "Approvals and
budgets"), against the PostgreSQL store: held rows oldest first by when they were held, paged in that
order, ahead of the rows that are not waiting for anyone (newest first)."""

from __future__ import annotations

from datetime import timedelta

from evq.worker.approval_policy import ApprovalPolicy
from evq.worker.ports import StepFilter
from evq.worker.states import Status
from tests.conformance.helpers import T0
from tests.support import valid

ALWAYS = ApprovalPolicy(always=True)


async def test_held_rows_list_oldest_first_by_held_since_and_page_in_that_order(store):
    # Enqueued out of time order, so id order and held_since order differ.
    middle = await store.enqueue(valid(step_id="m"), now=T0 + timedelta(hours=1), approval=ALWAYS)
    newest = await store.enqueue(valid(step_id="n"), now=T0 + timedelta(hours=2), approval=ALWAYS)
    oldest = await store.enqueue(valid(step_id="o"), now=T0, approval=ALWAYS)
    free = await store.enqueue(valid(step_id="p"), now=T0 + timedelta(hours=3))
    assert {s.status for s in (middle, newest, oldest)} == {Status.HELD} and free.status == Status.PENDING
    at = T0 + timedelta(hours=4)

    held, total = await store.list_steps(StepFilter(statuses=(Status.HELD,)), now=at)
    assert [s.id for s in held] == [oldest.id, middle.id, newest.id] and total == 3
    page, total = await store.list_steps(StepFilter(statuses=(Status.HELD,), limit=1, offset=1), now=at)
    assert [s.id for s in page] == [middle.id] and total == 3
    # Every status at once: the held queue first, oldest first; then the rest, newest first.
    everything, _ = await store.list_steps(StepFilter(), now=at)
    assert [s.id for s in everything] == [oldest.id, middle.id, newest.id, free.id]
