"""An outage is not a refusal (issue 12): the per-provider circuit breaker, for real.

A real SMTP server that is down (a closed port) and comes back on the same port, one
that refuses our password (535, aiosmtpd's own AUTH), one that fails every message
temporarily (451), and a Resend-style HTTP API refusing our key (401): the circuit
opens, no step is charged an attempt or rejected, one probe at a time goes out with
backoff, and once the provider answers every message goes out exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace

import psycopg
import pytest

from evq.adapters.http import HttpProvider
from evq.adapters.postgres.database import translate
from evq.adapters.postgres.queue_stats import QueueStatsReader
from evq.adapters.postgres.store import PostgresStore
from evq.adapters.smtp import SmtpProvider
from evq.ops.app.metrics import QueueCollector
from evq.ops.dev.http import DevHttpServer
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.runner import Worker
from tests.acceptance.conftest import Evq
from tests.support import WIRE_KEYS, rows, valid

SETTINGS = Settings(
    adapter=("smtp",),
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0.05,
    retry_max=0.2,
    rescue_interval=0.5,
    shutdown_grace=5,
    smtp_timeout=5,
    # Few attempts and a short budget: without the breaker an outage of a second or two
    # would spend them all and reject every message.
    max_attempts=3,
    retry_for=3600,
    circuit_probe_base=0.2,
    circuit_probe_max=0.4,
    reconcile_checks=0,
)


async def enqueue(store: PostgresStore, n: int, **kw) -> list[int]:
    return [(await store.enqueue(valid(step_id=f"s{i}", **kw))).id for i in range(n)]


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def statuses(db_url: str) -> dict[str, int]:
    return {r["status"]: r["n"] for r in rows(db_url, "SELECT status, count(*) AS n FROM steps_now GROUP BY status")}


def failed_probes(db_url: str, provider: str = "smtp") -> int:
    """Times the circuit re-opened after a probe (0 where there is no circuit table at all)."""
    if rows(db_url, "SELECT to_regclass('provider_circuit_events') IS NULL AS missing")[0]["missing"]:
        return 0
    return rows(
        db_url,
        "SELECT count(*) AS n FROM provider_circuit_events WHERE provider = %s "
        "AND from_state = 'half_open' AND to_state = 'open'",
        (provider,),
    )[0]["n"]


def outage_outlasted(db_url: str, probes: int = 3) -> bool:
    """Down long enough that every message would have spent its attempts without the breaker."""
    return statuses(db_url).get("rejected", 0) > 0 or failed_probes(db_url) >= probes


def charged(db_url: str) -> list[int]:
    return [r["n"] for r in rows(db_url, "SELECT attempts - uncharged_attempts AS n FROM steps_now ORDER BY id")]


def events(db_url: str, provider: str = "smtp") -> list[tuple[str, str, str | None]]:
    return [
        (r["from_state"], r["to_state"], r["reason"])
        for r in rows(db_url, "SELECT * FROM provider_circuit_events WHERE provider = %s ORDER BY id", (provider,))
    ]


async def run_until(worker: Worker, condition: Callable[[], bool]) -> None:
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        await wait_until(lambda: condition() or task.done())
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0


async def test_an_smtp_server_down_then_back_costs_no_attempt_and_every_message_goes_once(store, db_url):
    server = DevSmtpServer().start()
    server.stop()  # nothing listens on its port now: connection refused
    ids = await enqueue(store, 12)
    provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0)
    worker = Worker(store, {"smtp": provider}, SETTINGS.worker_config())
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        await wait_until(lambda: outage_outlasted(db_url) or task.done())
        assert statuses(db_url).get("rejected", 0) == 0, statuses(db_url)
        [circuit] = rows(db_url, "SELECT * FROM provider_circuits WHERE provider = 'smtp'")
        assert circuit["state"] in ("open", "half_open") and circuit["reason"] == "connection_refused"
        server.start()  # back, on the same port
        await wait_until(lambda: statuses(db_url).get("accepted") == len(ids) or task.done())
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        await provider.close()
        server.stop()
    assert statuses(db_url) == {"accepted": len(ids)}
    # Each message once at the server, and each charged exactly the attempt that delivered it.
    sent = server.by_message_id()
    assert len(sent) == len(ids) and set(sent.values()) == {1}
    assert charged(db_url) == [1] * len(ids)
    refused = rows(
        db_url,
        "SELECT count(*) AS n FROM evidence WHERE kind = 'provider_response' "
        "AND outcome = 'retryable' AND detail->>'charged' = 'false'",
    )[0]["n"]
    assert refused >= 4  # the first sends and the failed probes, none of them counted
    # Opened at once, probed with backoff, closed by the probe that got through.
    history = events(db_url)
    assert history[0] == ("closed", "open", "connection_refused")
    assert history[-2:] == [("open", "half_open", "probe"), ("half_open", "closed", "probe_succeeded")]
    assert [e for e in history if e[:2] == ("half_open", "open")], history
    probe_waits = [
        r["probe_in"]
        for r in rows(db_url, "SELECT probe_in FROM provider_circuit_events WHERE to_state = 'open' ORDER BY id")
    ]
    assert probe_waits[:2] == [pytest.approx(0.2, abs=0.01), pytest.approx(0.4, abs=0.01)]
    assert max(probe_waits) == pytest.approx(0.4, abs=0.01)  # EVQ_CIRCUIT_PROBE_MAX


async def test_a_wrong_smtp_password_opens_the_circuit_at_once_and_evq_says_why(store, db_url):
    """A real 535 from aiosmtpd's AUTH: every message would get it, none is charged for it."""
    with DevSmtpServer(auth=("evq", "the-right-one")) as server:
        ids = await enqueue(store, 20)
        provider = SmtpProvider(
            host="127.0.0.1", port=server.port, username="evq", password="a-wrong-one", allow_plain_auth=True
        )  # a loopback server without TLS
        settings = replace(SETTINGS, concurrency=2, batch_size=2, smtp_username="evq", smtp_password="a-wrong-one")
        try:
            await run_until(
                Worker(store, {"smtp": provider}, settings.worker_config()), lambda: outage_outlasted(db_url)
            )
        finally:
            await provider.close()
        assert server.messages == []
        counts = statuses(db_url)
        assert counts.get("rejected", 0) == 0 and sum(counts.values()) == len(ids), counts
        assert sum(charged(db_url)) == 0
        attempted = rows(db_url, "SELECT count(*) AS n FROM steps_now WHERE attempts > 0")[0]["n"]
        assert attempted < len(ids)  # most messages were never tried against the wall
        [circuit] = rows(db_url, "SELECT * FROM provider_circuits")
        assert circuit["reason"] == "auth_failed" and "535" in circuit["detail"]
        assert "a-wrong-one" not in str(rows(db_url, "SELECT * FROM provider_circuit_events"))

        # Why, in `evq providers list` (validated against its schema) and in the metric.
        listed = Evq(db_url).json("providers", "list")
        smtp = next(p for p in listed["data"] if p["provider"] == "smtp")
        assert smtp["state"] in ("open", "half_open") and not smtp["sending"]
        assert smtp["reason"] == "auth_failed" and "535" in smtp["detail"] and smtp["failed_probes"] >= 1
        assert listed["meta"]["held"] == 1
        assert {p["provider"]: p["state"] for p in listed["data"]}["http"] == "closed"
        human = Evq(db_url).run("providers", "list")
        assert human.returncode == 0 and "auth_failed" in human.stdout
        reader = QueueStatsReader(db_url)
        try:
            page = {
                (s.name, tuple(s.labels.items())): s.value
                for family in QueueCollector(reader.read).collect()
                for s in family.samples
            }
        finally:
            reader.close()
        assert page[("evq_provider_circuit_state", (("provider", "smtp"),))] >= 1
        assert page[("evq_provider_circuit_state", (("provider", "http"),))] == 0

        # The password fixed: the next probe gets through, the circuit closes, all go once.
        fixed = SmtpProvider(
            host="127.0.0.1", port=server.port, username="evq", password="the-right-one", allow_plain_auth=True
        )
        settings = replace(settings, smtp_password="the-right-one")
        try:
            await run_until(
                Worker(store, {"smtp": fixed}, settings.worker_config()),
                lambda: statuses(db_url).get("accepted") == len(ids),
            )
        finally:
            await fixed.close()
        assert set(server.by_message_id().values()) == {1} and len(server.by_message_id()) == len(ids)
        assert charged(db_url) == [1] * len(ids)
        assert rows(db_url, "SELECT state FROM provider_circuits") == [{"state": "closed"}]


async def test_every_recent_attempt_failing_the_same_way_opens_the_circuit(store, db_url):
    """No single fault, but a 451 for every message: after EVQ_CIRCUIT_FAILURES in a row the
    circuit opens; the failures before it are charged, none after."""
    with DevSmtpServer() as server:
        server.fault = "tempfail"
        ids = await enqueue(store, 10)
        provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0)
        settings = replace(SETTINGS, concurrency=1, batch_size=1, circuit_failures=3, max_attempts=5)
        try:
            await run_until(
                Worker(store, {"smtp": provider}, settings.worker_config()), lambda: outage_outlasted(db_url)
            )
            assert statuses(db_url).get("rejected", 0) == 0
            assert events(db_url)[0] == ("closed", "open", "consecutive_failures")
            assert sum(charged(db_url)) == 2  # the two failures before the third opened it
            server.fault = None
            await run_until(
                Worker(store, {"smtp": provider}, settings.worker_config()),
                lambda: statuses(db_url).get("accepted") == len(ids),
            )
        finally:
            await provider.close()
        assert statuses(db_url) == {"accepted": len(ids)}
        assert len(server.by_message_id()) == len(ids) and set(server.by_message_id().values()) == {1}


async def test_an_http_401_opens_the_circuit_and_charges_nothing(store, db_url):
    with DevHttpServer(api_key="the-right-key") as api:
        ids = await enqueue(store, 8, provider="http")
        settings = replace(
            SETTINGS, adapter=("http",), http_api_key="a-revoked-key", http_timeout=2.0, concurrency=2, batch_size=2
        )
        provider = HttpProvider(
            base_url=api.url, api_key="a-revoked-key", timeout=2.0, dedupe_window=3600, wire_keys=WIRE_KEYS
        )
        try:
            await run_until(
                Worker(store, {"http": provider}, settings.worker_config()),
                lambda: statuses(db_url).get("rejected", 0) > 0 or failed_probes(db_url, "http") >= 3,
            )
        finally:
            await provider.close()
        assert api.messages == []
        assert statuses(db_url).get("rejected", 0) == 0 and sum(charged(db_url)) == 0
        [circuit] = rows(db_url, "SELECT * FROM provider_circuits")
        assert circuit["provider"] == "http" and circuit["reason"] == "auth_failed" and "401" in circuit["detail"]
        assert "a-revoked-key" not in str(rows(db_url, "SELECT * FROM provider_circuit_events"))
        assert len(ids) == 8


class ProbeClaimAnswerLost:
    """The real store, except that the answer to the first probe claim is lost: the claim
    runs and commits, then the call fails as a dropped connection does."""

    def __init__(self, store: PostgresStore):
        self.store = store
        self.lost = 0

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    async def claim(self, **kwargs):
        claimed = await self.store.claim(**kwargs)
        if kwargs.get("probe") and not self.lost:
            self.lost = len(claimed)
            raise translate(psycopg.OperationalError("injected: the probe claim's answer was lost"))
        return claimed


async def test_a_probe_claim_whose_answer_is_lost_is_handed_back_and_sent_once(store, db_url):
    """The probe of an open circuit is claimed, its answer lost: the row was never sent, so it
    is handed back (its claim is named like any other) and goes out once the provider is back,
    not left in flight for the rescuer to call 'may have been delivered'."""
    server = DevSmtpServer().start()
    server.stop()  # connection refused: the first send opens the circuit
    [step] = await enqueue(store, 1)
    provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=2.0)
    lossy = ProbeClaimAnswerLost(store)
    # A short lease: on the bug the rescuer finds the lost probe's row within seconds.
    settings = replace(SETTINGS, lease_seconds=3, rescue_interval=0.2, circuit_probe_base=0.1, circuit_probe_max=0.2)
    worker = Worker(lossy, {"smtp": provider}, settings.worker_config())
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        await wait_until(lambda: events(db_url)[:1] == [("closed", "open", "connection_refused")] or task.done())
        server.start()  # back: the probe would get through, but its claim's answer is lost
        await wait_until(lambda: lossy.lost == 1 or task.done())
        await wait_until(lambda: bool({"accepted", "unknown"} & set(statuses(db_url))) or task.done(), timeout=20)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 30) == 0
        await provider.close()
        server.stop()
    [row] = rows(db_url, "SELECT status, reason FROM steps_now WHERE id = %s", (step,))
    assert row == {"status": "accepted", "reason": "provider_accepted"}, row
    assert list(server.by_message_id().values()) == [1]
    released = rows(db_url, "SELECT count(*) AS n FROM evidence WHERE kind = 'attempt_released'")[0]["n"]
    assert released == 1  # the lost probe's attempt, handed back unsent
    assert rows(db_url, "SELECT state FROM provider_circuits") == [{"state": "closed"}]


class StopAsProbeIsClaimed:
    """The real store; the worker is told to stop (as SIGTERM does) while its probe is claimed."""

    def __init__(self, store: PostgresStore):
        self.store = store
        self.worker: Worker | None = None
        self.probes = 0

    def __getattr__(self, name: str):
        return getattr(self.store, name)

    async def claim(self, **kwargs):
        claimed = await self.store.claim(**kwargs)
        if kwargs.get("probe") and claimed:
            self.probes += 1
            assert self.worker is not None
            self.worker.request_stop()
        return claimed


async def test_a_worker_stopped_as_it_takes_a_probe_gives_the_probe_back(store, db_url):
    """SIGTERM while the circuit is half-open under this worker, its probe not yet sent: the
    step is handed back and so is the probe, so another worker probes after
    EVQ_CIRCUIT_PROBE_BASE, not after the stopped worker's hold (a whole lease) runs out."""
    server = DevSmtpServer().start()
    server.stop()
    [step] = await enqueue(store, 1)
    provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=2.0)
    stopping = StopAsProbeIsClaimed(store)
    worker = stopping.worker = Worker(
        stopping, {"smtp": provider}, replace(SETTINGS, circuit_probe_base=0.1).worker_config()
    )
    try:
        assert await asyncio.wait_for(worker.run(install_signals=False), 30) == 0
    finally:
        await provider.close()
    assert stopping.probes == 1
    assert rows(db_url, "SELECT status FROM steps_now WHERE id = %s", (step,)) == [{"status": "retryable"}]
    [circuit] = rows(db_url, "SELECT state, probe_owner FROM provider_circuits WHERE provider = 'smtp'")
    assert circuit == {"state": "open", "probe_owner": None}, circuit
    assert events(db_url)[-2:] == [("open", "half_open", "probe"), ("half_open", "open", "connection_refused")]
