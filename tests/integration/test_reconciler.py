"""The reconciler against a real database and a real Resend-style API (ops.dev.http).

Provider has the message -> accepted with the lookup as evidence; provider lacks it
-> still unknown, the answer kept as evidence and shown to operators; several
reconcilers never ask twice about one row. Pacing and the config's checks, which need no
database, are in tests/core/test_reconciler.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY

from evq.adapters.http import HttpProvider
from evq.adapters.postgres.store import PostgresStore
from evq.ops.dev.http import DevHttpServer
from evq.ops.settings import Settings
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Unknown
from evq.worker.ports import LookupResult, SendRequest
from evq.worker.reconciler import Reconciler, ReconcilerConfig
from evq.worker.records import ReconcileCounts
from evq.worker.runner import Worker
from evq.worker.transitions import decide
from tests.acceptance.conftest import Evq
from tests.support import WIRE_KEYS, evidence_kinds, rows, step_row, valid

API_KEY = "devhttp-key"
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CONFIG = ReconcilerConfig(interval=60, rate=1000, max_checks=3, hold_seconds=120)


@pytest.fixture
def api() -> Iterator[DevHttpServer]:
    with DevHttpServer(api_key=API_KEY) as server:
        yield server


@pytest.fixture
async def provider(api: DevHttpServer) -> AsyncIterator[HttpProvider]:
    p = HttpProvider(base_url=api.url, api_key=API_KEY, timeout=1, wire_keys=WIRE_KEYS)
    yield p
    await p.close()


async def unknown_step(store: PostgresStore, provider: HttpProvider, api: DevHttpServer, *, sent: bool, **kw) -> int:
    """An http step left unknown: its one attempt either reached the provider (which
    took it and lost the answer) or never did; the row cannot tell which."""
    e = await store.enqueue(valid(provider="http", **kw), now=T0)
    [step] = await store.claim(owner="w", providers=["http"], limit=1, lease_seconds=30, dedupe_windows={}, now=T0)
    assert step.id == e.id
    if sent:
        api.queue_fault("reset")
        outcome = await provider.send(
            SendRequest(
                step_id=step.id,
                run_id=step.run_id,
                idempotency_key=step.idempotency_key,
                message_id=step.message_id,
                attempt=step.attempt,
                payload=step.payload,
            )
        )
    else:
        outcome = Unknown("timeout after the request was sent")
    transition = decide(step, outcome, default_max_attempts=5, backoff=Backoff(0, 0), dedupe_window_open=False)
    await store.record([transition], actor="w", now=T0)
    return e.id


def reconciled(db_url: str, step: int) -> list[dict]:
    return rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'reconciled' ORDER BY id", (step,))


def counted() -> dict[str, float]:
    """The reconciler's counters and the closing histogram's count, as a scrape would show them."""
    out = {
        r: REGISTRY.get_sample_value("evq_reconciled_total", {"result": r}) for r in ("accepted", "not_found", "error")
    }
    out["closed"] = REGISTRY.get_sample_value("evq_action_to_evidence_seconds_count")
    return out


def grew(before: dict[str, float], **by: float) -> bool:
    after = counted()
    return all(after[k] - before[k] == by.get(k, 0) for k in after)


def reconciler(store, provider, config: ReconcilerConfig = CONFIG, **kw) -> Reconciler:
    return Reconciler(store, {"http": provider}, config, actor="reconciler@test", **kw)


async def test_provider_has_it_so_the_step_is_accepted_with_evidence(store, db_url, api, provider):
    i = await unknown_step(store, provider, api, sent=True)
    before = counted()
    counts = await reconciler(store, provider).run_once(now=T0)
    assert counts == ReconcileCounts(accepted=1)
    # Counted as a reconciliation, and as a step closed by its evidence (enqueue -> accepted).
    assert grew(before, accepted=1, closed=1)
    row = step_row(db_url, i)
    [message] = api.messages
    assert row["status"] == "accepted" and row["reason"] == "reconciled"
    assert row["provider_message_id"] == message["id"]
    assert row["closed_at"] == T0 and row["unknown_since"] is None
    [ev] = reconciled(db_url, i)
    assert (ev["from_status"], ev["to_status"], ev["actor"]) == ("unknown", "accepted", "reconciler@test")
    assert ev["provider_message_id"] == message["id"]
    assert ev["detail"]["found"] is True and ev["detail"]["answer"]["email"]["id"] == message["id"]
    assert len(api.posts()) == 1  # asked, never sent again


async def test_provider_lacks_it_so_the_step_stays_unknown_with_evidence(store, db_url, api, provider):
    i = await unknown_step(store, provider, api, sent=False)
    r = reconciler(store, provider)
    before = counted()
    assert await r.run_once(now=T0) == ReconcileCounts(absent=1)
    assert grew(before, not_found=1)  # nothing closed
    row = step_row(db_url, i)
    assert row["status"] == "unknown" and row["reason"] == "ambiguous_response"
    assert row["reconcile_checks"] == 1 and row["reconcile_after"] == T0 + timedelta(seconds=60)
    [ev] = reconciled(db_url, i)
    assert ev["to_status"] is None and ev["reason"] == "reconcile_absent"
    assert ev["detail"]["found"] is False and ev["detail"]["check"] == 1
    assert "absence is not proof" in ev["detail"]["message"]
    # Asked again only later, each time waiting longer, and at most max_checks times.
    assert await r.run_once(now=T0 + timedelta(seconds=59)) == ReconcileCounts()
    assert await r.run_once(now=T0 + timedelta(seconds=60)) == ReconcileCounts(absent=1)
    assert step_row(db_url, i)["reconcile_after"] == T0 + timedelta(seconds=180)
    assert await r.run_once(now=T0 + timedelta(seconds=180)) == ReconcileCounts(absent=1)
    assert await r.run_once(now=T0 + timedelta(days=30)) == ReconcileCounts()
    last = reconciled(db_url, i)[-1]["detail"]
    assert last["check"] == 3 and "an operator decides" in last["message"]
    assert step_row(db_url, i)["status"] == "unknown"

    # Operators see the answer.
    shown = Evq(db_url).run("steps", "show", str(i))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "asked the provider 3 time(s)" in shown.stdout and "Absence is not proof" in shown.stdout


async def test_a_lookup_that_fails_changes_nothing_and_is_tried_again_after_the_hold(store, db_url, api, provider):
    i = await unknown_step(store, provider, api, sent=True)
    api.lookup_fault = "500"
    r = reconciler(store, provider)
    before = counted()
    assert await r.run_once(now=T0) == ReconcileCounts(failed=1)
    assert grew(before, error=1)
    assert reconciled(db_url, i) == [] and step_row(db_url, i)["reconcile_checks"] == 0
    api.lookup_fault = None
    assert await r.run_once(now=T0 + timedelta(seconds=60)) == ReconcileCounts()  # still held
    assert await r.run_once(now=T0 + timedelta(seconds=120)) == ReconcileCounts(accepted=1)


async def test_several_reconcilers_ask_about_each_row_once(store, db_url, api, provider):
    found = [await unknown_step(store, provider, api, sent=True) for _ in range(4)]
    absent = [await unknown_step(store, provider, api, sent=False) for _ in range(4)]
    stores = [await PostgresStore.open(db_url, max_size=2) for _ in range(3)]
    try:
        results = await asyncio.gather(*(reconciler(s, provider).run_once(now=T0) for s in stores))
    finally:
        for s in stores:
            await s.close()
    assert sum(c.accepted for c in results) == 4 and sum(c.absent for c in results) == 4
    assert sum(c.total for c in results) == 8
    for i in found + absent:
        assert len(reconciled(db_url, i)) == 1
    # Each row asked about once: a found one in one list, an absent one under both forms of the
    # tag (its own, then the bare digest a step evq 0.2.0 made was sent with).
    assert len([r for r in api.requests if r["method"] == "GET"]) == 4 + 2 * 4
    assert {step_row(db_url, i)["status"] for i in found} == {"accepted"}
    assert {step_row(db_url, i)["status"] for i in absent} == {"unknown"}


async def test_a_row_closed_while_the_provider_is_asked_is_left_alone(store, db_url, api, provider):
    i = await unknown_step(store, provider, api, sent=False)

    class OperatorClosesItMeanwhile:
        async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult:
            rows(
                db_url,
                "UPDATE email_steps SET status = 'accepted', unknown_since = NULL, closed_at = now(), "
                "reason = 'operator' WHERE id = %s RETURNING id",
                (i,),
            )
            return LookupResult(found=True, provider_message_id="late")

    r = Reconciler(store, {"http": OperatorClosesItMeanwhile()}, CONFIG)
    assert await r.run_once(now=T0) == ReconcileCounts(lost=1)
    row = step_row(db_url, i)
    assert row["reason"] == "operator" and row["provider_message_id"] is None and reconciled(db_url, i) == []


async def test_only_providers_that_can_look_up_are_asked(store, db_url, api, provider):
    e = await store.enqueue(valid(provider="smtp"), now=T0)
    [step] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=30, dedupe_windows={}, now=T0)
    transition = decide(step, Unknown("reset"), default_max_attempts=5, backoff=Backoff(0, 0), dedupe_window_open=False)
    await store.record([transition], actor="w", now=T0)
    assert await reconciler(store, provider).run_once(now=T0) == ReconcileCounts()
    assert evidence_kinds(db_url, e.id) == ["attempt_started", "provider_response"]


async def test_the_worker_reconciles_what_it_left_unknown(store, db_url, api):
    """A worker with a lookup-capable adapter runs the reconciler (here: in its drain)."""
    settings = Settings(
        adapter=("http",),
        http_api_key=API_KEY,
        http_timeout=1,
        lease_seconds=30,
        poll_interval=0.05,
        retry_base=0,
        retry_max=0,
    )
    short = HttpProvider(
        base_url=api.url, api_key=API_KEY, timeout=1, dedupe_window=5, wire_keys=WIRE_KEYS
    )  # less than a lease
    e = await store.enqueue(valid(provider="http", step_id="lost"))
    api.queue_fault("reset")
    try:
        worker = Worker(store, {"http": short}, settings.worker_config())
        assert worker.reconciler is not None
        assert await worker.run(drain=True, install_signals=False) == 0
    finally:
        await short.close()
    row = step_row(db_url, e.id)
    assert row["status"] == "accepted" and row["reason"] == "reconciled"
    assert evidence_kinds(db_url, e.id) == ["attempt_started", "provider_response", "reconciled"]
    assert len(api.posts()) == 1 and len(api.messages) == 1
