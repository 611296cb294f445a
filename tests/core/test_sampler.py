"""The queue sampler (worker/sampler.py) never stops its process: a run of failures is logged
once at warning, the recovery once at info, and each pass says whether it wrote the minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import structlog

from evq.worker.errors import DatabaseUnavailable
from evq.worker.sampler import SAMPLE_SECONDS, QueueSampler
from evq.worker.window import KEEP_SAMPLES


class Flaky:
    """The store, whose sample write fails while ``down`` is set and which samples at ``now``
    (a fixed minute, so two passes fall in the same minute whenever the test runs)."""

    def __init__(self, store, now: datetime):
        self.store, self.now, self.down = store, now, False

    def __getattr__(self, name):
        return getattr(self.store, name)

    async def sample_queue(self, sampled_by, *, keep_seconds, now=None):
        if self.down:
            raise DatabaseUnavailable("connection refused")
        return await self.store.sample_queue(sampled_by, keep_seconds=keep_seconds, now=self.now)


async def test_failures_are_logged_once_and_the_sampler_goes_on(store):
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    flaky = Flaky(store, minute + timedelta(seconds=1))
    sampler = QueueSampler(flaky, sampled_by="w1")
    assert sampler.keep_seconds == KEEP_SAMPLES and 5 < sampler.interval <= SAMPLE_SECONDS + 5
    with structlog.testing.capture_logs() as logs:
        assert (await sampler.run_once()).written == 1
        flaky.now = minute + timedelta(seconds=50)
        assert (await sampler.run_once()).written == 0  # the same minute: the first write won
        flaky.down = True
        assert [(await sampler.run_once()).failed for _ in range(3)] == [1, 1, 1]
        flaky.down = False
        flaky.now = minute + timedelta(minutes=1, seconds=1)  # the next minute: written again
        assert (await sampler.run_once()).written == 1
    events = [(e["event"], e["log_level"]) for e in logs]
    assert events == [("queue_sample_failed", "warning"), ("queue_sample_resumed", "info")]
    assert logs[0]["error"] == "connection refused"
    samples = await store.chart_queue_samples(1, now=minute + timedelta(minutes=2))
    assert [s["at"] for s in samples] == [minute, minute + timedelta(minutes=1)]
