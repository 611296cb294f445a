"""The queue sampler (worker/sampler.py) never stops its process: a run of failures is logged
once at warning, the recovery once at info, and each pass says whether it wrote the minute."""

from __future__ import annotations

import structlog

from evq.worker.errors import DatabaseUnavailable
from evq.worker.sampler import SAMPLE_SECONDS, QueueSampler
from evq.worker.window import KEEP_SAMPLES
from tests.memstore import MemoryStore


class Flaky(MemoryStore):
    """The in-memory store, whose sample write fails while ``down`` is set."""

    down = False

    async def sample_queue(self, sampled_by, *, keep_seconds, now=None):
        if self.down:
            raise DatabaseUnavailable("connection refused")
        return await super().sample_queue(sampled_by, keep_seconds=keep_seconds, now=now)


async def test_failures_are_logged_once_and_the_sampler_goes_on():
    store = Flaky()
    sampler = QueueSampler(store, sampled_by="w1")
    assert sampler.keep_seconds == KEEP_SAMPLES and 5 < sampler.interval <= SAMPLE_SECONDS + 5
    with structlog.testing.capture_logs() as logs:
        assert (await sampler.run_once()).written == 1
        assert (await sampler.run_once()).written == 0  # the same minute: the first write won
        store.down = True
        assert [(await sampler.run_once()).failed for _ in range(3)] == [1, 1, 1]
        store.down = False
        store.queue_samples.clear()
        assert (await sampler.run_once()).written == 1
    events = [(e["event"], e["log_level"]) for e in logs]
    assert events == [("queue_sample_failed", "warning"), ("queue_sample_resumed", "info")]
    assert logs[0]["error"] == "connection refused"
    assert [s["sampled_by"] for s in store.queue_samples.values()] == ["w1"]
