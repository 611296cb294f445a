"""The recorder's group commit against the in-memory store: one write for what has gathered,
every error retried, an unclassified failure split so one outcome holds back only itself."""

from __future__ import annotations

import asyncio

import pytest

from evq.worker.backoff import Backoff
from evq.worker.errors import DatabaseUnavailable
from evq.worker.outcomes import Accepted
from evq.worker.recorder import Recorder
from evq.worker.transitions import decide
from tests.memstore import MemoryStore
from tests.support import valid


async def transitions(store: MemoryStore, n: int) -> list:
    for _ in range(n):
        await store.enqueue(valid())
    claimed = await store.claim(owner="w", providers=["smtp"], limit=n, lease_seconds=60, dedupe_windows={})
    return [
        decide(c, Accepted(f"pm-{c.id}"), default_max_attempts=3, backoff=Backoff(0, 0), dedupe_window_open=False)
        for c in claimed
    ]


class Flaky:
    """The store, whose next ``failures`` record calls raise ``error``; counts the batches."""

    def __init__(
        self, store: MemoryStore, failures: int = 0, error: Exception | None = None, poison: int | None = None
    ):
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


async def test_outcomes_that_gather_are_written_in_one_batch(mem):
    ts = await transitions(mem, 20)
    flaky = Flaky(mem)
    recorder = Recorder(flaky, actor="w")
    recorder.start()
    try:
        results = await asyncio.gather(*(recorder.submit(t) for t in ts))
    finally:
        await recorder.stop()
    assert all(r.applied for r in results) and flaky.batches == [20]
    assert {s["status"] for s in mem.steps.values()} == {"accepted"}


async def test_a_database_that_is_away_is_waited_for_and_nothing_is_lost(mem):
    ts = await transitions(mem, 5)
    flaky = Flaky(mem, failures=3, error=DatabaseUnavailable("connection refused"))
    recorder = Recorder(flaky, actor="w", retry_max_wait=0.05)
    recorder.start()
    try:
        results = await asyncio.wait_for(asyncio.gather(*(recorder.submit(t) for t in ts)), 5)
    finally:
        await recorder.stop()
    assert all(r.applied for r in results) and recorder.retries == 3
    assert [e["kind"] for e in mem.evidence].count("provider_response") == 5


async def test_an_outcome_that_cannot_be_written_holds_back_only_itself(mem):
    ts = await transitions(mem, 4)
    flaky = Flaky(mem, poison=ts[0].step_id)
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
    assert mem.steps[ts[0].step_id]["status"] == "in_flight"  # the rescuer's, never forgotten as sent
    assert flaky.batches[0] == 4 and set(flaky.batches[1:4]) == {1}  # split after the unclassified error


async def test_a_write_retried_after_its_answer_was_lost_is_a_duplicate(mem):
    [t] = await transitions(mem, 1)

    class AnswerLost(Flaky):
        async def record(self, transitions, *, actor):
            results = await self.store.record(transitions, actor=actor)
            if not self.batches:
                self.batches.append(1)
                raise DatabaseUnavailable("the commit's acknowledgement was lost")
            return results

    recorder = Recorder(AnswerLost(mem), actor="w", retry_max_wait=0.01)
    recorder.start()
    try:
        result = await asyncio.wait_for(recorder.submit(t), 5)
    finally:
        await recorder.stop()
    assert not result.applied and result.duplicate
    assert [e["kind"] for e in mem.evidence] == ["attempt_started", "provider_response"]
