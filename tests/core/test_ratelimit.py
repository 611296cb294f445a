"""The shared rate limit in the worker against a store (a fresh PostgreSQL database): workers sharing one store
together stay under the rate, and a "too fast" answer pauses all of them."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from evq.worker.config import WorkerConfig
from evq.worker.outcomes import Accepted, Retryable
from evq.worker.ports import SendRequest
from evq.worker.ratelimit import RateLimit
from evq.worker.runner import Worker
from tests.storeview import statuses, steps
from tests.support import valid

SETTINGS = WorkerConfig(
    concurrency=10,
    batch_size=10,
    lease_seconds=30,
    poll_interval=0.02,
    retry_base=0,
    retry_max=0,
    shutdown_grace=5,
    reconcile_checks=0,
    rate_limit=(RateLimit("smtp", 40.0, 4),),
)


class Timed:
    name = "smtp"
    dedupe_window = None

    def __init__(self, throttle_first: float | None = None):
        self.at: list[float] = []
        self.throttle_first = throttle_first

    async def send(self, request: SendRequest):
        self.at.append(time.monotonic())
        if self.throttle_first is not None and len(self.at) == 1:
            return Retryable("429 too many requests", retry_after=self.throttle_first, throttled=True)
        return Accepted(f"pm-{request.step_id}")

    async def close(self) -> None:
        return None


async def test_workers_sharing_a_store_stay_under_the_rate_together(store):
    for _ in range(24):
        await store.enqueue(valid())
    provider = Timed()
    started = time.monotonic()
    workers = [Worker(store, {"smtp": provider}, SETTINGS) for _ in range(3)]
    assert await asyncio.gather(*(w.run(drain=True, install_signals=False) for w in workers)) == [0, 0, 0]
    assert len(provider.at) == 24 and await statuses(store) == {"accepted": 24}
    # A burst of 4, then 40 a second for everyone together: the last of 24 no sooner than 0.5 s.
    assert provider.at[-1] - started >= (24 - 4) / 40 - 0.02
    assert sum(w.stats.claimed for w in workers) == 24


async def test_a_too_fast_answer_pauses_the_provider_for_every_worker(store):
    for _ in range(3):
        await store.enqueue(valid())
    provider = Timed(throttle_first=0.3)
    settings = replace(SETTINGS, concurrency=1, batch_size=1)
    pauses: list[float] = []

    class Pausing:
        """The store, keeping how long each pause it was asked for lasts."""

        def __getattr__(self, name):
            return getattr(store, name)

        async def rate_pause(self, **kw):
            pauses.append(await store.rate_pause(**kw))
            return pauses[-1]

    pausing = Pausing()  # the workers below share it
    first = asyncio.create_task(Worker(pausing, {"smtp": provider}, settings).run(drain=True, install_signals=False))
    while not provider.at:
        await asyncio.sleep(0.001)
    # Another worker starts once the provider has said "too fast" to the first.
    second = Worker(pausing, {"smtp": provider}, settings)
    assert await asyncio.gather(first, second.run(drain=True, install_signals=False)) == [0, 0]
    # The throttled step's retry is due a moment after the pause ends (its answer was recorded
    # after the pause began): a drain that looked just before then left it for later, as a
    # drain leaves any step not yet due. A last drain sends it.
    if len(provider.at) == 3:
        [later] = [s for s in await steps(store) if s["status"] == "retryable"]
        await asyncio.sleep(max(0.0, (later["next_attempt_at"] - datetime.now(UTC)).total_seconds()) + 0.01)
        assert await Worker(pausing, {"smtp": provider}, settings).run(drain=True, install_signals=False) == 0
    assert len(provider.at) == 4  # the throttled attempt, then each of the three
    assert await statuses(store) == {"accepted": 3}
    assert min(provider.at[1:]) - provider.at[0] >= 0.29  # nobody sent before the pause ended
    assert pauses and pauses[0] == pytest.approx(0.3, abs=0.05)  # the store keeps the pause for every worker
