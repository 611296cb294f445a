"""Long work's stop rules with a fake action (the real ones run in tests/acceptance/test_operator.py)."""

from __future__ import annotations

import pytest

from evq.ops.app.longwork import each
from evq.worker.errors import Conflict, MaxFailures


def action(failing: set[int]):
    async def act(item: int) -> dict:
        if item in failing:
            raise Conflict(f"item {item} taken")
        return {"value": item * 10}

    return act


async def test_each_item_is_done_on_its_own_and_failures_are_recorded():
    tally = await each([1, 2, 3], action({2}), key=lambda i: {"id": i}, what="test")
    assert (tally.succeeded, tally.failed) == (2, 1)
    assert tally.results == [
        {"id": 1, "outcome": "succeeded", "value": 10},
        {"id": 2, "outcome": "failed", "error": {"code": "E_CONFLICT", "message": "item 2 taken"}},
        {"id": 3, "outcome": "succeeded", "value": 30},
    ]


async def test_max_failures_counts_only_failures_in_a_row():
    tally = await each([1, 2, 3, 4, 5], action({1, 3, 5}), key=lambda i: {"id": i}, what="test", max_failures=2)
    assert tally.failed == 3  # never two in a row
    with pytest.raises(MaxFailures) as err:
        await each([1, 2, 3, 4, 5], action({2, 3}), key=lambda i: {"id": i}, what="test", max_failures=2)
    assert err.value.code == "E_MAX_FAILURES"
    assert (err.value.context["succeeded"], err.value.context["failed"], err.value.context["not_attempted"]) == (
        1,
        2,
        2,
    )
