"""The reconciler against a store (a fresh PostgreSQL database), with lookups written for the test (the
integration tests keep the real Resend-style API: tests/integration/test_reconciler.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from evq.worker.backoff import Backoff
from evq.worker.config import WorkerConfig
from evq.worker.errors import ConfigError
from evq.worker.outcomes import Unknown
from evq.worker.ports import LookupFailed, LookupResult, SendRequest
from evq.worker.reconciler import Reconciler, ReconcilerConfig
from evq.worker.records import ReconcileCounts
from evq.worker.runner import Worker
from evq.worker.transitions import decide
from tests.storeview import evidence, step
from tests.support import valid

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CONFIG = ReconcilerConfig(interval=60, rate=1000, max_checks=3, hold_seconds=120)


class Lookups:
    """A provider's lookup: ``has`` holds the keys it took; ``fail`` makes every lookup fail."""

    def __init__(self, has=(), fail=None):
        self.has = set(has)
        self.fail = fail
        self.asked: list[str] = []

    async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult:
        self.asked.append(idempotency_key)
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        if idempotency_key in self.has:
            return LookupResult(found=True, provider_message_id=f"pm-{idempotency_key}", raw={"id": idempotency_key})
        return LookupResult(found=False, raw={"data": []})


async def unknown_step(store: Any, **kw) -> int:
    e = await store.enqueue(valid(provider="http", **kw), now=T0)
    claimed = await store.claim(owner="w", providers=["http"], limit=10, lease_seconds=30, dedupe_windows={}, now=T0)
    [step] = [c for c in claimed if c.id == e.id]
    t = decide(
        step,
        Unknown("timeout after the request"),
        default_max_attempts=5,
        backoff=Backoff(0, 0),
        dedupe_window_open=False,
    )
    await store.record([t], actor="w", now=T0)
    return e.id


async def reconciled(store: Any, step_id: int) -> list:
    return [e for e in await evidence(store, step_id) if e["kind"] == "reconciled"]


async def key_of(store: Any, step_id: int) -> str:
    return str((await step(store, step_id))["idempotency_key"])


def reconciler(store, lookups, config=CONFIG, **kw) -> Reconciler:
    return Reconciler(store, {"http": lookups}, config, actor="reconciler@test", **kw)


async def test_provider_has_it_so_the_step_is_accepted_with_evidence(store):
    i = await unknown_step(store)
    key = await key_of(store, i)
    assert await reconciler(store, Lookups(has={key})).run_once(now=T0) == ReconcileCounts(accepted=1)
    row = await step(store, i)
    assert (row["status"], row["reason"], row["provider_message_id"]) == ("accepted", "reconciled", f"pm-{key}")
    assert row["closed_at"] == T0 and row["unknown_since"] is None
    [ev] = await reconciled(store, i)
    assert (ev["from_status"], ev["to_status"], ev["actor"]) == ("unknown", "accepted", "reconciler@test")
    assert ev["detail"]["found"] is True and ev["detail"]["answer"] == {"id": key}


async def test_provider_lacks_it_so_the_step_stays_unknown_and_is_asked_again_later(store):
    i = await unknown_step(store)
    r = reconciler(store, Lookups())
    assert await r.run_once(now=T0) == ReconcileCounts(absent=1)
    row = await step(store, i)
    assert (row["status"], row["reason"], row["reconcile_checks"]) == ("unknown", "ambiguous_response", 1)
    assert row["reconcile_after"] == T0 + timedelta(seconds=60)
    [ev] = await reconciled(store, i)
    assert ev["to_status"] is None and ev["reason"] == "reconcile_absent" and ev["detail"]["check"] == 1
    assert "absence is not proof" in ev["detail"]["message"]
    assert await r.run_once(now=T0 + timedelta(seconds=59)) == ReconcileCounts()
    assert await r.run_once(now=T0 + timedelta(seconds=60)) == ReconcileCounts(absent=1)
    assert (await step(store, i))["reconcile_after"] == T0 + timedelta(seconds=180)
    assert await r.run_once(now=T0 + timedelta(seconds=180)) == ReconcileCounts(absent=1)
    assert await r.run_once(now=T0 + timedelta(days=30)) == ReconcileCounts()
    last = (await reconciled(store, i))[-1]["detail"]
    assert last["check"] == 3 and "an operator decides" in last["message"]
    assert (await step(store, i))["status"] == "unknown"


@pytest.mark.parametrize("error", [LookupFailed("HTTP 500"), RuntimeError("a bug in the adapter")])
async def test_a_lookup_that_fails_changes_nothing_and_is_tried_again_after_the_hold(store, error):
    i = await unknown_step(store)
    lookups = Lookups(has={await key_of(store, i)}, fail=error)
    r = reconciler(store, lookups)
    assert await r.run_once(now=T0) == ReconcileCounts(failed=1)
    assert await reconciled(store, i) == [] and (await step(store, i))["reconcile_checks"] == 0
    lookups.fail = None
    assert await r.run_once(now=T0 + timedelta(seconds=60)) == ReconcileCounts()  # still held
    assert await r.run_once(now=T0 + timedelta(seconds=120)) == ReconcileCounts(accepted=1)


async def test_several_reconcilers_ask_about_each_row_once(store):
    found = [await unknown_step(store) for _ in range(4)]
    absent = [await unknown_step(store) for _ in range(4)]
    lookups = Lookups(has={await key_of(store, i) for i in found})
    results = await asyncio.gather(*(reconciler(store, lookups).run_once(now=T0) for _ in range(3)))
    assert sum(c.accepted for c in results) == 4 and sum(c.absent for c in results) == 4
    assert sorted(lookups.asked) == sorted([await key_of(store, i) for i in found + absent])
    assert [len(await reconciled(store, i)) for i in found + absent] == [1] * 8


async def test_a_row_closed_while_the_provider_is_asked_is_left_alone(store):
    i = await unknown_step(store)

    class OperatorClosesItMeanwhile:
        async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult:
            await store.reconcile_found(i, provider_message_id="op", message="m", detail={}, actor="op", now=T0)
            return LookupResult(found=True, provider_message_id="late")

    assert await reconciler(store, OperatorClosesItMeanwhile()).run_once(now=T0) == ReconcileCounts(lost=1)
    assert (await step(store, i))["provider_message_id"] == "op" and len(await reconciled(store, i)) == 1


async def test_only_providers_that_can_look_up_are_asked(store):
    e = await store.enqueue(valid(provider="smtp"), now=T0)
    [step] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=30, dedupe_windows={}, now=T0)
    t = decide(step, Unknown("reset"), default_max_attempts=5, backoff=Backoff(0, 0), dedupe_window_open=False)
    await store.record([t], actor="w", now=T0)
    assert await reconciler(store, Lookups()).run_once(now=T0) == ReconcileCounts()
    assert await reconciled(store, e.id) == []


async def test_lookups_are_paced_and_a_pass_is_bounded(store):
    for _ in range(4):
        await unknown_step(store)
    clock = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    config = ReconcilerConfig(interval=1.5, rate=2, max_checks=3, hold_seconds=120)  # 3 lookups a pass
    r = reconciler(store, Lookups(), config, sleep=sleep, clock=lambda: clock[0])
    assert await r.run_once(now=T0) == ReconcileCounts(absent=3)
    assert slept == [0.5, 0.5]
    assert await r.run_once(now=T0) == ReconcileCounts(absent=1)
    assert slept == [0.5, 0.5, 0.5]
    assert await r.run_once(now=T0) == ReconcileCounts()  # nothing due: no wait at all
    assert slept == [0.5, 0.5, 0.5]


def test_config_is_validated():
    for bad in (
        dict(rate=0),
        dict(interval=0),
        dict(max_checks=0),
        dict(hold_seconds=0),
        dict(rate=0.001),
        dict(batch=0),
    ):
        with pytest.raises(ConfigError):
            replace(CONFIG, **bad).validate()
    assert ReconcilerConfig(interval=30, rate=2).per_pass == 60
    assert [CONFIG.next_check(n) for n in (1, 2, 3)] == [60, 120, 240]


class LookupProvider(Lookups):
    """An HTTP-like provider that takes the message, loses the answer, and can look it up."""

    name = "http"
    dedupe_window = 5.0  # less than a lease: the ambiguous send is not retried

    async def send(self, request: SendRequest):
        self.has.add(request.idempotency_key)
        return Unknown("the connection reset after the request was written")

    async def close(self) -> None:
        return None


async def test_the_worker_reconciles_what_it_left_unknown(store):
    settings = WorkerConfig(lease_seconds=30, poll_interval=0.02, retry_base=0, retry_max=0)
    e = await store.enqueue(valid(provider="http", step_id="lost"))
    provider = LookupProvider()
    worker = Worker(store, {"http": provider}, settings)
    assert worker.reconciler is not None
    assert await worker.run(drain=True, install_signals=False) == 0
    row = await step(store, e.id)
    assert (row["status"], row["reason"]) == ("accepted", "reconciled")
    assert [x["kind"] for x in await evidence(store, e.id)] == [
        "attempt_started",
        "provider_response",
        "reconciled",
    ]
