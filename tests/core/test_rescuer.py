"""The rescuer's pass against the in-memory store: every expired lease, batch after batch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from evq.worker.errors import ConfigError
from evq.worker.records import RescueCounts
from evq.worker.rescuer import Rescuer, RescuerConfig
from tests.support import valid

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


async def test_a_pass_rescues_every_expired_lease_in_batches(mem):
    for _ in range(7):
        await mem.enqueue(valid(), now=T0)
    await mem.claim(owner="w", providers=["smtp"], limit=5, lease_seconds=30, dedupe_windows={"smtp": 3600}, now=T0)
    await mem.claim(owner="w", providers=["smtp"], limit=5, lease_seconds=30, dedupe_windows={}, now=T0)
    rescuer = Rescuer(mem, RescuerConfig(batch=2, lease_seconds=30), actor="rescuer@w")
    assert await rescuer.run_once(now=T0 + timedelta(seconds=30)) == RescueCounts()
    calls = len(mem.calls)
    counts = await rescuer.run_once(now=T0 + timedelta(seconds=31))
    assert counts == RescueCounts(unknown=2, retryable=5)
    assert len(mem.calls) - calls == 4  # 2 + 2 + 2 + 1: it goes on while a batch comes back full
    assert {s["status"] for s in mem.steps.values()} == {"unknown", "retryable"}
    assert all(s["maybe_delivered"] for s in mem.steps.values())
    assert {e["actor"] for e in mem.evidence if e["kind"] == "lease_expired"} == {"rescuer@w"}


async def test_a_window_that_closes_makes_the_retryable_row_unknown(mem):
    e = await mem.enqueue(valid(), now=T0)
    await mem.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=30, dedupe_windows={"smtp": 100}, now=T0)
    rescuer = Rescuer(mem, RescuerConfig(lease_seconds=30))
    assert await rescuer.run_once(now=T0 + timedelta(seconds=31)) == RescueCounts(retryable=1)
    assert await rescuer.run_once(now=T0 + timedelta(seconds=71)) == RescueCounts(window_closed=1)
    assert (mem.steps[e.id]["status"], mem.steps[e.id]["reason"]) == ("unknown", "dedupe_window_closed")


def test_config_is_validated():
    for bad in (dict(interval=0), dict(batch=0), dict(lease_seconds=0), dict(default_max_attempts=0)):
        with pytest.raises(ConfigError):
            RescuerConfig(**bad).validate()
