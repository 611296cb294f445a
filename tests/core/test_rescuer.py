"""The rescuer's pass against a store (a fresh PostgreSQL database): every expired lease, batch after batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.errors import ConfigError
from evq.worker.records import RescueCounts
from evq.worker.rescuer import Rescuer, RescuerConfig
from tests.storeview import evidence, statuses, step, steps
from tests.support import valid

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def test_a_pass_rescues_every_expired_lease_in_batches(store):
    for _ in range(7):
        await store.enqueue(valid(), now=T0)
    await store.claim(owner="w", providers=["smtp"], limit=5, lease_seconds=30, dedupe_windows={"smtp": 3600}, now=T0)
    await store.claim(owner="w", providers=["smtp"], limit=5, lease_seconds=30, dedupe_windows={}, now=T0)

    class Counting:
        """The store, counting the rescuer's batches."""

        rescues = 0

        def __getattr__(self, name):
            return getattr(store, name)

        async def rescue(self, **kw):
            self.rescues += 1
            return await store.rescue(**kw)

    counting = Counting()
    rescuer = Rescuer(counting, RescuerConfig(batch=2, lease_seconds=30), actor="rescuer@w")
    assert await rescuer.run_once(now=T0 + timedelta(seconds=30)) == RescueCounts()
    calls = counting.rescues
    counts = await rescuer.run_once(now=T0 + timedelta(seconds=31))
    assert counts == RescueCounts(unknown=2, retryable=5)
    assert counting.rescues - calls == 4  # 2 + 2 + 2 + 1: it goes on while a batch comes back full
    assert set(await statuses(store)) == {"unknown", "retryable"}
    assert all(s["maybe_delivered"] for s in await steps(store))
    assert {e["actor"] for e in await evidence(store) if e["kind"] == "lease_expired"} == {"rescuer@w"}


async def test_a_window_that_closes_makes_the_retryable_row_unknown(store):
    e = await store.enqueue(valid(), now=T0)
    await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=30, dedupe_windows={"smtp": 100}, now=T0)
    rescuer = Rescuer(store, RescuerConfig(lease_seconds=30))
    assert await rescuer.run_once(now=T0 + timedelta(seconds=31)) == RescueCounts(retryable=1)
    assert await rescuer.run_once(now=T0 + timedelta(seconds=71)) == RescueCounts(window_closed=1)
    row = await step(store, e.id)
    assert (row["status"], row["reason"]) == ("unknown", "dedupe_window_closed")


def test_config_is_validated():
    for bad in (dict(interval=0), dict(batch=0), dict(lease_seconds=0), dict(default_max_attempts=0)):
        with pytest.raises(ConfigError):
            RescuerConfig(**bad).validate()
