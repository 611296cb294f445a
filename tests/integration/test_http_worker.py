"""The worker, the HTTP adapter and the dedupe window together: real PostgreSQL, real HTTP.

The window rules (docs/design.md, "Invariants", 4; issue 4): an ambiguous attempt is retried
with the same key only while the provider's window, counted from the first attempt,
still covers a whole lease; after that the step is unknown and no second request
is ever sent; spent attempts after a possible delivery end unknown, never rejected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from evq.adapters.http import HttpProvider
from evq.adapters.postgres.store import PostgresStore
from evq.ops.dev.http import DevHttpServer
from evq.ops.settings import Settings
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Retryable
from evq.worker.runner import Worker
from evq.worker.transitions import decide
from tests.support import WIRE_KEYS, evidence_kinds, rows, step_row, valid

API_KEY = "devhttp-key"
SETTINGS = Settings(
    adapter=("http",),
    http_api_key=API_KEY,
    http_timeout=0.5,
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
    reconcile_checks=0,  # the reconciler has its own tests; here unknown rows stay unknown
)
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def api() -> Iterator[DevHttpServer]:
    with DevHttpServer(api_key=API_KEY, dedupe_window=3600, slow_seconds=2) as server:
        yield server


async def http(api: DevHttpServer, window: float = 3600) -> HttpProvider:
    return HttpProvider(base_url=api.url, api_key=API_KEY, timeout=0.5, dedupe_window=window, wire_keys=WIRE_KEYS)


async def drain(store: PostgresStore, provider: HttpProvider, settings: Settings = SETTINGS) -> int:
    return await Worker(store, {"http": provider}, settings.worker_config()).run(drain=True, install_signals=False)


@pytest.fixture
async def provider(api: DevHttpServer) -> AsyncIterator[HttpProvider]:
    p = await http(api)
    yield p
    await p.close()


async def answers(db_url: str, step: int) -> list[tuple[str, str, str]]:
    return [
        (r["outcome"], r["to_status"], r["reason"])
        for r in rows(
            db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = 'provider_response' ORDER BY id", (step,)
        )
    ]


@pytest.mark.parametrize("fault", ["reset", "slow", "502"])
async def test_an_ambiguous_answer_inside_the_window_is_retried_and_delivered_once(store, db_url, api, provider, fault):
    e = await store.enqueue(valid(provider="http", step_id="report"))
    api.queue_fault(fault)
    assert await drain(store, provider) == 0
    row = step_row(db_url, e.id)
    assert row["status"] == "accepted" and row["attempts"] == 2 and row["maybe_delivered"]
    [message] = api.messages
    assert row["provider_message_id"] == message["id"]
    assert [r["idempotency_key"] for r in api.posts()] == [WIRE_KEYS.key(e.id, "run-1:report")] * 2
    assert await answers(db_url, e.id) == [
        ("unknown", "retryable", "ambiguous_deduped"),
        ("accepted", "accepted", "provider_accepted"),
    ]


@pytest.mark.parametrize("fault", ["reset", "slow"])
async def test_an_ambiguous_answer_after_the_window_is_unknown_and_never_sent_again(store, db_url, api, fault):
    """The provider keeps keys for less than a lease: a retry could send a second copy.
    A reset and a timeout after the request was written are the same case."""
    short = await http(api, window=5)
    e = await store.enqueue(valid(provider="http", step_id="report"))
    api.queue_fault(fault)
    try:
        assert await drain(store, short) == 0
        row = step_row(db_url, e.id)
        assert row["status"] == "unknown" and row["reason"] == "ambiguous_response" and row["attempts"] == 1
        assert await drain(store, short) == 0
    finally:
        await short.close()
    assert len(api.posts()) == 1 and step_row(db_url, e.id)["status"] == "unknown"


async def test_a_window_that_closes_before_the_retry_sends_nothing_more(store, db_url, api, provider):
    e = await store.enqueue(valid(provider="http", step_id="report"))
    api.queue_fault("reset")
    settings = replace(SETTINGS, retry_base=3600, retry_max=3600)
    assert await drain(store, provider, settings) == 0
    assert step_row(db_url, e.id)["status"] == "retryable"
    # Time passes: the retry is due, but the provider's window no longer covers a lease.
    now = datetime.now(UTC)
    for table in ("email_steps", "step_queue"):
        rows(
            db_url,
            f"UPDATE {table} SET next_attempt_at = %s, dedupe_until = %s WHERE id = %s RETURNING id",
            (now, now + timedelta(seconds=10), e.id),
        )
    assert await drain(store, provider, settings) == 0
    row = step_row(db_url, e.id)
    assert row["status"] == "unknown" and row["reason"] == "dedupe_window_closed"
    assert len(api.posts()) == 1 and evidence_kinds(db_url, e.id)[-1] == "window_closed"


async def test_spent_attempts_after_a_possible_delivery_end_unknown_not_rejected(store, db_url, api, provider):
    e = await store.enqueue(valid(provider="http", step_id="report", max_attempts=2, notify="agent@example.org"))
    api.queue_fault("reset")
    api.queue_fault("500")
    assert await drain(store, provider) == 0
    row = step_row(db_url, e.id)
    assert row["status"] == "unknown" and row["reason"] == "attempts_exhausted" and row["attempts"] == 2
    assert await answers(db_url, e.id) == [
        ("unknown", "retryable", "ambiguous_deduped"),
        ("retryable", "unknown", "attempts_exhausted"),
    ]
    # Not rejected, so its sender is not told it did not go out.
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now WHERE notice_of IS NOT NULL")[0]["n"] == 0


async def test_spent_attempts_that_never_reached_the_provider_end_rejected(store, db_url, api, provider):
    e = await store.enqueue(valid(provider="http", max_attempts=2))
    api.queue_fault("500", times=2)
    assert await drain(store, provider) == 0
    row = step_row(db_url, e.id)
    assert row["status"] == "rejected" and row["reason"] == "attempts_exhausted" and not row["maybe_delivered"]


async def test_retry_after_is_honoured(store, db_url, api, provider):
    e = await store.enqueue(valid(provider="http"))
    api.queue_fault("429", seconds=120)
    assert await drain(store, provider) == 0
    row = step_row(db_url, e.id)
    assert row["status"] == "retryable" and row["next_attempt_at"] - row["updated_at"] >= timedelta(seconds=120)
    assert len(api.posts()) == 1


async def test_the_window_is_counted_from_the_first_attempt(store, db_url):
    """Later attempts never move the deadline; a window learnt only later is still counted from the first."""

    async def attempt(at: datetime, windows: dict[str, float]):
        [step] = await store.claim(
            owner="w", providers=["http"], limit=1, lease_seconds=30, dedupe_windows=windows, now=at
        )
        fail = decide(step, Retryable("503"), default_max_attempts=5, backoff=Backoff(0, 0), dedupe_window_open=False)
        await store.record([fail], actor="w", now=at)
        return step

    e = await store.enqueue(valid(provider="http"), now=T0)
    first = await attempt(T0, {})  # a worker that knew no window
    assert first.dedupe_remaining is None and step_row(db_url, e.id)["dedupe_until"] is None
    second = await attempt(T0 + timedelta(seconds=1000), {"http": 3600.0})
    assert second.dedupe_remaining == 2600
    assert step_row(db_url, e.id)["dedupe_until"] == T0 + timedelta(seconds=3600)
    await attempt(T0 + timedelta(seconds=1010), {"http": 86400.0})  # a longer window configured later
    assert step_row(db_url, e.id)["dedupe_until"] == T0 + timedelta(seconds=3600)
