"""The circuit breaker in the worker against a store (a fresh PostgreSQL database): an outage is not a refusal.
(tests/integration/test_circuit.py keeps the real SMTP and HTTP servers; tests/unit/test_circuit.py
the rules alone.)"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from evq.worker.config import WorkerConfig
from evq.worker.errors import DatabaseUnavailable
from evq.worker.outcomes import Accepted, Retryable
from evq.worker.ports import SendRequest
from evq.worker.runner import Worker
from tests.storeview import circuit, kinds, statuses, step, steps
from tests.support import valid

SETTINGS = WorkerConfig(
    concurrency=4,
    batch_size=4,
    lease_seconds=30,
    poll_interval=0.02,
    retry_base=0.01,
    retry_max=0.05,
    rescue_interval=0.5,
    shutdown_grace=5,
    max_attempts=3,
    retry_for=3600,
    circuit_probe_base=0.05,
    circuit_probe_max=0.1,
    reconcile_checks=0,
)


class Outage:
    """A provider that refuses connections (a provider-level fault) until it is ``up``;
    ``fail`` instead makes every send fail temporarily, with no fault named."""

    name = "smtp"
    dedupe_window = None

    def __init__(self, fail: bool = False):
        self.up = False
        self.fail = fail
        self.sent: collections.Counter[str] = collections.Counter()
        self.calls = 0

    async def send(self, request: SendRequest):
        self.calls += 1
        await asyncio.sleep(0.001)
        if not self.up:
            if self.fail:
                return Retryable("smtp 451 at rcpt")
            return Retryable("ConnectionRefusedError at connect", fault="connection_refused")
        self.sent[request.message_id] += 1
        return Accepted(f"pm-{request.step_id}-{request.attempt}")

    async def close(self) -> None:
        return None


async def enqueue(store: Any, n: int) -> list[int]:
    return [(await store.enqueue(valid(step_id=f"s{i}"))).id for i in range(n)]


class Circuits:
    """The store, keeping each change of the smtp circuit its calls made, as the circuit's
    event row says it (from, to, reason, seconds to the next probe): the worker changes a
    circuit only through these four calls, and the store answers whether each one took."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.events: list[dict[str, Any]] = []
        self.state = "closed"
        self.reason: str | None = None  # the open circuit's, which a probe that finds nothing keeps

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _moved(self, to: str, reason: str, probe_in: float | None = None) -> None:
        self.events.append({"from_state": self.state, "to_state": to, "reason": reason, "probe_in": probe_in})
        self.state = to

    async def circuit_trip(self, **kw: Any) -> Any:
        got = await self.store.circuit_trip(**kw)
        if got is not None:
            assert got["from_state"] == self.state, (got, self.events)
            self.reason = kw["reason"]
            self._moved("open", kw["reason"], round(got["probe_in"], 3))
        return got

    async def circuit_close(self, **kw: Any) -> bool:
        got = await self.store.circuit_close(**kw)
        if got:
            self._moved("closed", kw["reason"])
        return got

    async def circuit_probe_take(self, **kw: Any) -> bool:
        got = await self.store.circuit_probe_take(**kw)
        if got:
            self._moved("half_open", "probe")
        return got

    async def circuit_probe_idle(self, **kw: Any) -> bool:
        got = await self.store.circuit_probe_idle(**kw)
        if got:
            self._moved("open", self.reason or "")
        return got

    def history(self) -> list[tuple[str, str, str | None]]:
        return [(e["from_state"], e["to_state"], e["reason"]) for e in self.events]

    def failed_probes(self) -> int:
        return sum(1 for e in self.history() if e[:2] == ("half_open", "open"))


async def charged(store: Any) -> list[int]:
    return [s["attempts"] - s["uncharged_attempts"] for s in await steps(store)]


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def run_until(worker: Worker, condition: Callable[[], Awaitable[bool]]) -> None:
    task = asyncio.create_task(worker.run(install_signals=False))

    async def done() -> bool:
        return task.done() or await condition()

    try:
        await wait_until(done)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0


async def test_a_provider_down_then_back_costs_no_attempt_and_every_message_goes_once(store):
    ids = await enqueue(store, 12)
    provider = Outage()
    watched = Circuits(store)
    worker = Worker(watched, {"smtp": provider}, SETTINGS)
    task = asyncio.create_task(worker.run(install_signals=False))

    async def probes_failed() -> bool:
        return watched.failed_probes() >= 3 or task.done()

    async def all_accepted() -> bool:
        return (await statuses(store))["accepted"] == len(ids) or task.done()

    try:
        # Down long enough that, without the breaker, every message would have spent its 3 attempts.
        await wait_until(probes_failed)
        assert (await statuses(store))["rejected"] == 0
        c = await circuit(store, "smtp")
        assert c is not None and c["state"] in ("open", "half_open") and c["reason"] == "connection_refused"
        assert provider.calls < len(ids) + watched.failed_probes() + SETTINGS.concurrency  # one probe at a time
        provider.up = True
        await wait_until(all_accepted)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
    assert await statuses(store) == {"accepted": len(ids)}
    assert len(provider.sent) == len(ids) and set(provider.sent.values()) == {1}
    assert await charged(store) == [1] * len(ids)
    history = watched.history()
    assert history[0] == ("closed", "open", "connection_refused")
    assert history[-2:] == [("open", "half_open", "probe"), ("half_open", "closed", "probe_succeeded")]
    waits = [e["probe_in"] for e in watched.events if e["to_state"] == "open"]
    assert waits[:2] == [0.05, 0.1] and max(waits) == 0.1  # doubling, at most EVQ_CIRCUIT_PROBE_MAX


async def test_every_recent_attempt_failing_the_same_way_opens_the_circuit(store):
    """No fault named, but a 451 for every message: after EVQ_CIRCUIT_FAILURES in a row the
    circuit opens; the failures before it are charged, none after."""
    ids = await enqueue(store, 10)
    provider = Outage(fail=True)
    settings = replace(SETTINGS, concurrency=1, batch_size=1, circuit_failures=3, max_attempts=5)
    watched = Circuits(store)

    async def probes_failed() -> bool:
        return watched.failed_probes() >= 3

    async def all_accepted() -> bool:
        return (await statuses(store))["accepted"] == len(ids)

    await run_until(Worker(watched, {"smtp": provider}, settings), probes_failed)
    assert (await statuses(store))["rejected"] == 0
    assert watched.history()[0] == ("closed", "open", "consecutive_failures")
    assert sum(await charged(store)) == 2  # the two failures before the third opened it
    provider.up = True
    await run_until(Worker(watched, {"smtp": provider}, settings), all_accepted)
    assert len(provider.sent) == len(ids) and set(provider.sent.values()) == {1}


async def test_a_probe_claim_whose_answer_is_lost_is_handed_back_and_sent_once(store, monkeypatch):
    # The lost probe's hold (a lease) must lapse before a worker probes again, and the worker
    # looks at the circuits every CIRCUIT_READ seconds (read in worker/circuit_sharing.py):
    # both shortened, to keep this fast.
    monkeypatch.setattr("evq.worker.circuit_sharing.CIRCUIT_READ", 0.1)
    [one] = await enqueue(store, 1)
    provider = Outage()
    watched = Circuits(store)

    class ProbeClaimAnswerLost:
        lost = 0

        def __getattr__(self, name):
            return getattr(watched, name)

        async def claim(self, **kwargs):
            claimed = await store.claim(**kwargs)
            if kwargs.get("probe") and not self.lost:
                self.lost = len(claimed)
                raise DatabaseUnavailable("injected: the probe claim's answer was lost")
            return claimed

    lossy = ProbeClaimAnswerLost()
    worker = Worker(lossy, {"smtp": provider}, replace(SETTINGS, lease_seconds=1, rescue_interval=0.1))
    task = asyncio.create_task(worker.run(install_signals=False))

    async def opened() -> bool:
        return watched.history()[:1] == [("closed", "open", "connection_refused")] or task.done()

    async def probe_lost() -> bool:
        return lossy.lost == 1 or task.done()

    async def settled() -> bool:
        return bool({"accepted", "unknown"} & set(await statuses(store))) or task.done()

    try:
        await wait_until(opened)
        provider.up = True  # back: the probe would get through, but its claim's answer is lost
        await wait_until(probe_lost)
        await wait_until(settled)
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
    row = await step(store, one)
    assert (row["status"], row["reason"]) == ("accepted", "provider_accepted")
    assert list(provider.sent.values()) == [1]
    assert (await kinds(store, one)).count("attempt_released") == 1  # the lost probe, unsent
    c = await circuit(store, "smtp")
    assert c is not None and c["state"] == "closed"


async def test_a_worker_stopped_as_it_takes_a_probe_gives_the_probe_back(store):
    [one] = await enqueue(store, 1)
    provider = Outage()
    watched = Circuits(store)

    class StopAsProbeIsClaimed:
        probes = 0

        def __getattr__(self, name):
            return getattr(watched, name)

        async def claim(self, **kwargs):
            claimed = await store.claim(**kwargs)
            if kwargs.get("probe") and claimed:
                self.probes += 1
                worker.request_stop()
            return claimed

    stopping = StopAsProbeIsClaimed()
    worker = Worker(stopping, {"smtp": provider}, SETTINGS)
    assert await asyncio.wait_for(worker.run(install_signals=False), 10) == 0
    assert stopping.probes == 1 and (await step(store, one))["status"] == "retryable"
    c = await circuit(store, "smtp")
    assert c is not None and (c["state"], c["probe_owner"]) == ("open", None)
    assert watched.history()[-2:] == [("open", "half_open", "probe"), ("half_open", "open", "connection_refused")]
