"""The recorder's group commit against a store (a fresh PostgreSQL database): one write for what has gathered,
every error retried, an unclassified failure split so one outcome holds back only itself."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from evq.worker.backoff import Backoff
from evq.worker.errors import DatabaseUnavailable
from evq.worker.outcome_writer import Recorder
from evq.worker.outcomes import Accepted
from evq.worker.transitions import decide
from tests.storeview import kinds, statuses, step
from tests.support import valid


async def transitions(store: Any, n: int) -> list:
    for _ in range(n):
        await store.enqueue(valid())
    claimed = await store.claim(owner="w", providers=["smtp"], limit=n, lease_seconds=60, dedupe_windows={})
    return [
        decide(c, Accepted(f"pm-{c.id}"), default_max_attempts=3, backoff=Backoff(0, 0), dedupe_window_open=False)
        for c in claimed
    ]


class Flaky:
    """The store, whose next ``failures`` record calls raise ``error``; counts the batches."""

    def __init__(self, store: Any, failures: int = 0, error: Exception | None = None, poison: int | None = None):
        self.store, self.failures, self.error, self.poison = store, failures, error, poison
        self.batches: list[int] = []

    async def record(self, transitions, *, actor):
        self.batches.append(len(transitions))
        if self.poison is not None and any(t.step_id == self.poison for t in transitions):
            raise RuntimeError("this outcome cannot be written")
        if self.failures:
            self.failures -= 1
            raise self.error
        return await self.store.record(transitions, actor=actor)


async def test_outcomes_that_gather_are_written_in_one_batch(store):
    ts = await transitions(store, 20)
    flaky = Flaky(store)
    recorder = Recorder(flaky, actor="w")
    recorder.start()
    try:
        results = await asyncio.gather(*(recorder.submit(t) for t in ts))
    finally:
        await recorder.stop()
    assert all(r.applied for r in results) and flaky.batches == [20]
    assert await statuses(store) == {"accepted": 20}


async def test_a_database_that_is_away_is_waited_for_and_nothing_is_lost(store):
    ts = await transitions(store, 5)
    flaky = Flaky(store, failures=3, error=DatabaseUnavailable("connection refused"))
    recorder = Recorder(flaky, actor="w", retry_max_wait=0.05)
    recorder.start()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(recorder.submit(t) for t in ts)), 5)
    finally:
        await recorder.stop()
    assert all(r.applied for r in results) and recorder.retries == 3
    assert (await kinds(store)).count("provider_response") == 5


async def test_an_outcome_that_cannot_be_written_holds_back_only_itself(store):
    ts = await transitions(store, 4)
    flaky = Flaky(store, poison=ts[0].step_id)
    recorder = Recorder(flaky, actor="w", retry_max_wait=0.05)
    recorder.start()
    futures = [asyncio.ensure_future(recorder.submit(t)) for t in ts]
    try:
        done = await asyncio.wait_for(asyncio.gather(*futures[1:]), 5)
        assert all(r.applied for r in done)
        assert not futures[0].done() and recorder.pending == 1
    finally:
        await recorder.stop()
    with pytest.raises(asyncio.CancelledError):  # abandoned at stop, never reported as written
        await futures[0]
    assert (await step(store, ts[0].step_id))["status"] == "in_flight"  # the rescuer's, never forgotten as sent
    assert flaky.batches[0] == 4 and set(flaky.batches[1:4]) == {1}  # split after the unclassified error


async def test_a_write_retried_after_its_answer_was_lost_is_a_duplicate(store):
    [t] = await transitions(store, 1)

    class AnswerLost(Flaky):
        async def record(self, transitions, *, actor):
            results = await self.store.record(transitions, actor=actor)
            if not self.batches:
                self.batches.append(1)
                raise DatabaseUnavailable("the commit's acknowledgement was lost")
            return results

    recorder = Recorder(AnswerLost(store), actor="w", retry_max_wait=0.01)
    recorder.start()
    try:
        result = await asyncio.wait_for(recorder.submit(t), 5)
    finally:
        await recorder.stop()
    assert not result.applied and result.duplicate
    assert await kinds(store) == ["attempt_started", "provider_response"]
