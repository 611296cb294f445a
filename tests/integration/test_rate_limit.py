"""Providers' rate limits (issue 12), for real: one PostgreSQL, several workers, a real HTTP provider.

The provider (ops/dev/http.py) answers 429 with Retry-After to POSTs beyond its own
cap per second, as Resend does. The limit is a token bucket row in PostgreSQL taken
before every claim, so workers in different processes (different hosts, as far as
the database can tell) together stay under it; a 429 pauses the provider for every
worker until its Retry-After. Counts are taken at the server, per window of its own
arrival times; bounds are generous, and no assertion depends on the machine being fast.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from evq.adapters.http import HttpProvider
from evq.adapters.postgres.store import PostgresStore
from evq.ops.dev.http import DevHttpServer
from evq.ops.settings import Settings
from evq.worker.ratelimit import rate_limits
from evq.worker.runner import Worker
from tests.support import WIRE_KEYS, ScriptedProvider, rows, spawn, valid

API_KEY = "devhttp-key"
SETTINGS = Settings(
    adapter=("http",),
    http_api_key=API_KEY,
    http_timeout=2,
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=5,
    shutdown_grace=5,
    reconcile_checks=0,
)
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def api() -> Iterator[DevHttpServer]:
    # The provider's own cap: 20 POSTs in any second; beyond that, 429 + Retry-After.
    with DevHttpServer(api_key=API_KEY, dedupe_window=3600, rate_limit=20) as server:
        yield server


def max_in_window(times: list[float], window: float = 1.0) -> int:
    """The most arrivals inside any half-open interval of ``window`` seconds."""
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window:
            start += 1
        best = max(best, end - start + 1)
    return best


def workers(db_url: str, api: DevHttpServer, count: int, **env: str) -> list[subprocess.Popen]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("EVQ_")}
    base.update(
        EVQ_DATABASE_URL=db_url,
        EVQ_ADAPTER="http",
        EVQ_HTTP_BASE_URL=api.url,
        EVQ_HTTP_API_KEY=API_KEY,
        EVQ_HTTP_TIMEOUT="2",
        EVQ_LEASE_SECONDS="30",
        EVQ_CONCURRENCY="4",
        EVQ_BATCH_SIZE="4",
        EVQ_POLL_INTERVAL="0.05",
        EVQ_RETRY_BASE="0",
        EVQ_RETRY_MAX="0",
        EVQ_RECONCILE_CHECKS="0",
        EVQ_LOG_FORMAT="json",
        EVQ_LOG_LEVEL="warning",
        **env,
    )
    cmd = [sys.executable, "-m", "tests.child", "worker", "run", "--drain"]
    return [
        spawn(cmd, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(count)
    ]


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[tuple[int, str]]:
    """Wait for every worker to drain and exit; kill whatever is left, whatever happens."""
    out = []
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append((p.returncode, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return out


async def enqueue(store: PostgresStore, n: int, prefix: str = "s") -> list[int]:
    return [(await store.enqueue(valid(provider="http", step_id=f"{prefix}-{i}"))).id for i in range(n)]


def statuses(db_url: str) -> dict[str, int]:
    return {r["status"]: r["n"] for r in rows(db_url, "SELECT status, count(*) AS n FROM steps_now GROUP BY status")}


# -- across processes ------------------------------------------------------------------


async def test_without_a_shared_limit_a_fleet_of_workers_is_a_storm_of_429s(store, db_url, api):
    """The fault itself: three workers, no EVQ_RATE_LIMIT, a provider capped at 20/s."""
    await enqueue(store, 60)
    results = finish(workers(db_url, api, 3))
    assert all(code == 0 for code, _ in results), results
    answered = [r["status"] for r in api.posts()]
    assert answered.count(429) > 0, "the provider's cap was never reached: the fault did not happen"
    assert max_in_window([r["at"] for r in api.posts()]) > 20
    print(
        f"no limit: {len(api.posts())} requests, {answered.count(429)} answered 429, "
        f"{max_in_window([r['at'] for r in api.posts()])} in the busiest second"
    )


async def test_workers_in_three_processes_together_stay_under_the_providers_rate(store, db_url, api):
    """EVQ_RATE_LIMIT=http=8/s:4 in each of three worker processes: the provider sees at most
    burst + rate in any second (4 + 8 = 12, well under its cap of 20), never a 429, and the
    whole run takes as long as the rate says, however the work was split between workers."""
    n = 40
    await enqueue(store, n)
    results = finish(workers(db_url, api, 3, EVQ_RATE_LIMIT="http=8/s:4"))
    assert all(code == 0 for code, _ in results), results
    posts = api.posts()
    assert [r["status"] for r in posts] == [200] * n, "a 429 (or a second request) means the limit did not hold"
    assert sorted(api.by_message_id().values()) == [1] * n
    assert statuses(db_url) == {"accepted": n}
    times = [r["at"] for r in posts]
    # A token bucket never grants more than burst + rate x window; the server's clock adds only
    # the jitter between a claim and its request, so its own cap (20) is the hard line.
    assert max_in_window(times) <= 20
    # Slower is always allowed; faster is not: 36 requests beyond the burst need 36 / 8 = 4.5 s.
    assert max(times) - min(times) >= 0.8 * (n - 4) / 8
    print(
        f"rate limit: {n} requests from 3 processes, at most {max_in_window(times)} in any second, "
        f"over {max(times) - min(times):.2f}s"
    )
    # More than one process took part (the limit was shared, not one worker's own pacing).
    owners = {r["actor"] for r in rows(db_url, "SELECT DISTINCT actor FROM evidence WHERE kind = 'attempt_started'")}
    assert len(owners) >= 2, owners
    [bucket] = rows(db_url, "SELECT * FROM provider_rate_limits")
    assert bucket["provider"] == "http" and 0 <= bucket["tokens"] <= 4 and bucket["paused_until"] is None


# -- a 429 pauses the whole provider ------------------------------------------------------


@asynccontextmanager
async def running(db_url: str, api: DevHttpServer, settings: Settings, count: int) -> AsyncIterator[list[Worker]]:
    """``count`` workers, each with its own pool and adapter (as on separate hosts), running
    until the block ends; then stopped, and each must have stopped cleanly."""
    stores = [await PostgresStore.open(db_url, max_size=2) for _ in range(count)]
    providers = [
        HttpProvider(base_url=api.url, api_key=API_KEY, timeout=2, dedupe_window=3600, wire_keys=WIRE_KEYS)
        for _ in stores
    ]
    fleet = [Worker(s, {"http": p}, settings.worker_config()) for s, p in zip(stores, providers, strict=True)]
    tasks = [asyncio.create_task(w.run(install_signals=False)) for w in fleet]
    try:
        yield fleet
    finally:
        for w in fleet:
            w.request_stop()
        codes = await asyncio.gather(*tasks, return_exceptions=True)
        for p in providers:
            await p.close()
        for s in stores:
            await s.close()
    assert codes == [0] * count


async def test_a_429_with_retry_after_pauses_every_worker_for_that_provider(db_url, api):
    """Three workers (each its own pool, as on three hosts). The first send gets 429 with
    Retry-After: 3. From then until the pause written in PostgreSQL ends, the provider sees
    no request at all from any worker, although 20 more steps are waiting; then all are sent, once."""
    # Well under the provider's cap of 20/s (burst + rate = 12 in any second): 10/s with a
    # burst of 10 is 20, exactly the cap, and a loaded machine's jitter made it a 21st (a 429).
    settings = replace(SETTINGS, rate_limit=rate_limits("http=8/s:4"))
    api.queue_fault("429", seconds=3)
    async with running(db_url, api, settings, 3) as fleet:
        await enqueue(fleet[0].store, 1, prefix="first")
        await wait_until(lambda: any(r["status"] == 429 for r in api.posts()), "the 429")
        paused = await wait_for_pause(db_url)
        await enqueue(fleet[0].store, 20, prefix="waiting")
        await wait_until(lambda: statuses(db_url) == {"accepted": 21}, "21 accepted", timeout=60)
    t429 = next(r["at"] for r in api.posts() if r["status"] == 429)
    until = paused.timestamp()
    assert until >= t429 + 3  # the whole Retry-After, counted from no earlier than the answer
    later = [r for r in api.posts() if r["at"] > t429]
    assert len(later) == 21 and all(r["status"] == 200 for r in later)
    # Nothing reached the provider during the pause, from any of the three workers.
    assert min(r["at"] for r in later) >= until - 0.01, min(r["at"] for r in later) - until
    assert sorted(api.by_message_id().values()) == [1] * 21
    # The step that got the 429 waited its Retry-After too, and its evidence says why.
    [first] = rows(db_url, "SELECT id FROM steps_now WHERE step_id = 'first-0'")
    answers = rows(
        db_url,
        "SELECT outcome, to_status, detail FROM evidence WHERE step_id = %s AND kind = 'provider_response' ORDER BY id",
        (first["id"],),
    )
    assert [(a["outcome"], a["to_status"]) for a in answers] == [("retryable", "retryable"), ("accepted", "accepted")]
    assert answers[0]["detail"]["code"] == 429


async def test_a_429_without_a_limit_pauses_the_worker_that_saw_it_and_is_written_down(db_url, api):
    """No EVQ_RATE_LIMIT (no statement per claim): a 429 still stops this worker until its
    Retry-After, and the pause is written down for the workers that do have a limit."""
    api.queue_fault("429", seconds=2)
    async with running(db_url, api, SETTINGS, 1) as fleet:
        await enqueue(fleet[0].store, 1, prefix="first")
        await wait_until(lambda: any(r["status"] == 429 for r in api.posts()), "the 429")
        paused = await wait_for_pause(db_url)
        await enqueue(fleet[0].store, 5, prefix="waiting")
        await wait_until(lambda: statuses(db_url) == {"accepted": 6}, "6 accepted", timeout=60)
    t429 = next(r["at"] for r in api.posts() if r["status"] == 429)
    later = [r for r in api.posts() if r["at"] > t429]
    assert len(later) == 6 and all(r["status"] == 200 for r in later)
    # The worker's own pause is counted on its monotonic clock from when it read the answer.
    assert min(r["at"] for r in later) >= t429 + 2
    assert paused.timestamp() >= t429 + 2


async def wait_until(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g}s")
        await asyncio.sleep(0.02)


async def wait_for_pause(db_url: str) -> datetime:
    found: list[datetime] = []

    def check() -> bool:
        found[:] = [
            r["paused_until"]
            for r in rows(db_url, "SELECT paused_until FROM provider_rate_limits WHERE paused_until IS NOT NULL")
        ]
        return bool(found)

    await wait_until(check, "pause in provider_rate_limits")
    return found[0]


# -- the bucket itself, on the database clock -------------------------------------------------


async def test_the_bucket_refills_from_the_database_clock_and_never_holds_more_than_its_burst(store):
    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    async def take(want: int, seconds: float):
        return await store.rate_take(provider="http", per_second=2, burst=4, want=want, now=at(seconds))

    first = await take(10, 0)  # first use: a full bucket, and no more
    assert (first.granted, first.paused_for) == (4, 0) and first.next_token_in == pytest.approx(0.5)
    assert (await take(1, 0.25)).granted == 0  # half a token is not a token
    assert (await take(3, 1.0)).granted == 2  # 2/s for one second
    assert (await take(10, 3600)).granted == 4  # an hour idle still refills only to the burst
    await store.rate_refund(provider="http", burst=4, tokens=3)  # a claim that found 1 row of 4
    assert (await take(10, 3600)).granted == 3
    # A clock behind the last take (a statement that started before the previous holder's) adds nothing.
    assert (await take(10, 3599)).granted == 0

    assert await store.rate_pause(provider="http", seconds=5, now=at(3600)) == pytest.approx(5)
    paused = await take(1, 3601)
    assert paused.granted == 0 and paused.paused_for == pytest.approx(4)
    # A shorter pause never cuts a longer one short.
    assert await store.rate_pause(provider="http", seconds=1, now=at(3600)) == pytest.approx(5)
    assert (await take(1, 3604.9)).granted == 0
    assert (await take(10, 3605)).granted == 4
    [row] = rows(store_url(store), "SELECT * FROM provider_rate_limits")
    assert row["tokens"] == 0 and row["paused_until"] == at(3605)


async def test_concurrent_takes_from_many_connections_never_grant_more_than_the_bucket_holds(db_url):
    """Twenty takes at once from four pools, first use included (the seed races too), at one
    instant of the database clock: exactly the burst is granted, to whoever got the lock first."""
    stores = [await PostgresStore.open(db_url, max_size=5) for _ in range(4)]
    try:
        grants = await asyncio.gather(
            *(s.rate_take(provider="smtp", per_second=1, burst=7, want=1, now=T0) for s in stores for _ in range(5))
        )
    finally:
        for s in stores:
            await s.close()
    assert sorted(g.granted for g in grants) == [0] * 13 + [1] * 7


# -- no limit, no cost ---------------------------------------------------------------------------


class CountingStore:
    """The real store, counting every call the worker makes on it by method name."""

    def __init__(self, inner: PostgresStore):
        self.inner = inner
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await attr(*args, **kwargs)

        return counted


SMTP = Settings(
    adapter=("smtp",),
    smtp_timeout=1,
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=5,
    reconcile_checks=0,
)


@pytest.mark.parametrize("limit", [None, "smtp=1000/s:1000"])
async def test_without_a_limit_a_claim_costs_no_extra_statement(store, limit):
    counting = CountingStore(store)
    for i in range(12):
        await store.enqueue(valid(provider="smtp", step_id=f"s-{i}"))
    settings = SMTP if limit is None else replace(SMTP, rate_limit=rate_limits(limit))
    provider = ScriptedProvider()
    assert (
        await Worker(counting, {"smtp": provider}, settings.worker_config()).run(drain=True, install_signals=False) == 0
    )
    assert len(provider.calls) == 12
    rate_calls = {name: n for name, n in counting.calls.items() if name.startswith("rate_")}
    if limit is None:
        assert rate_calls == {}, counting.calls  # the hot path pays nothing
        assert counting.calls["claim"] >= 3
    else:
        # The same counting sees the limit's statements when there is one: one take per claim
        # (plus the first use's seed and take), and unused tokens given back.
        assert counting.calls["rate_take"] == counting.calls["claim"]
        assert rate_calls.get("rate_refund", 0) >= 1


def store_url(store: PostgresStore) -> str:
    return store.pool.conninfo
