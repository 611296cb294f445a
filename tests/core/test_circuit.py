"""The circuit breaker in the worker against the in-memory store: an outage is not a refusal.
(tests/integration/test_circuit.py keeps the real SMTP and HTTP servers; tests/unit/test_circuit.py
the rules alone.)"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import replace

from evq.worker.config import WorkerConfig
from evq.worker.errors import DatabaseUnavailable
from evq.worker.outcomes import Accepted, Retryable
from evq.worker.ports import SendRequest
from evq.worker.runner import Worker
from tests.memstore import MemoryStore
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


async def enqueue(store: MemoryStore, n: int) -> list[int]:
    return [(await store.enqueue(valid(step_id=f"s{i}"))).id for i in range(n)]


def statuses(store: MemoryStore) -> collections.Counter[str]:
    return collections.Counter(s["status"] for s in store.steps.values())


def events(store: MemoryStore) -> list[tuple[str, str, str | None]]:
    return [(e["from_state"], e["to_state"], e["reason"]) for e in store.circuit_events]


def failed_probes(store: MemoryStore) -> int:
    return sum(1 for e in events(store) if e[:2] == ("half_open", "open"))


def charged(store: MemoryStore) -> list[int]:
    return [s["attempts"] - s["uncharged_attempts"] for s in sorted(store.steps.values(), key=lambda s: s["id"])]


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def run_until(worker: Worker, condition: Callable[[], bool]) -> None:
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        await wait_until(lambda: condition() or task.done())
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0


async def test_a_provider_down_then_back_costs_no_attempt_and_every_message_goes_once(mem):
    ids = await enqueue(mem, 12)
    provider = Outage()
    worker = Worker(mem, {"smtp": provider}, SETTINGS)
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        # Down long enough that, without the breaker, every message would have spent its 3 attempts.
        await wait_until(lambda: failed_probes(mem) >= 3 or task.done())
        assert statuses(mem)["rejected"] == 0
        c = mem.circuit_rows["smtp"]
        assert c["state"] in ("open", "half_open") and c["reason"] == "connection_refused"
        assert provider.calls < len(ids) + failed_probes(mem) + SETTINGS.concurrency  # one probe at a time
        provider.up = True
        await wait_until(lambda: statuses(mem)["accepted"] == len(ids) or task.done())
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
    assert statuses(mem) == {"accepted": len(ids)}
    assert len(provider.sent) == len(ids) and set(provider.sent.values()) == {1}
    assert charged(mem) == [1] * len(ids)
    history = events(mem)
    assert history[0] == ("closed", "open", "connection_refused")
    assert history[-2:] == [("open", "half_open", "probe"), ("half_open", "closed", "probe_succeeded")]
    waits = [e["probe_in"] for e in mem.circuit_events if e["to_state"] == "open"]
    assert waits[:2] == [0.05, 0.1] and max(waits) == 0.1  # doubling, at most EVQ_CIRCUIT_PROBE_MAX


async def test_every_recent_attempt_failing_the_same_way_opens_the_circuit(mem):
    """No fault named, but a 451 for every message: after EVQ_CIRCUIT_FAILURES in a row the
    circuit opens; the failures before it are charged, none after."""
    ids = await enqueue(mem, 10)
    provider = Outage(fail=True)
    settings = replace(SETTINGS, concurrency=1, batch_size=1, circuit_failures=3, max_attempts=5)
    await run_until(Worker(mem, {"smtp": provider}, settings), lambda: failed_probes(mem) >= 3)
    assert statuses(mem)["rejected"] == 0
    assert events(mem)[0] == ("closed", "open", "consecutive_failures")
    assert sum(charged(mem)) == 2  # the two failures before the third opened it
    provider.up = True
    await run_until(Worker(mem, {"smtp": provider}, settings), lambda: statuses(mem)["accepted"] == len(ids))
    assert len(provider.sent) == len(ids) and set(provider.sent.values()) == {1}


async def test_a_probe_claim_whose_answer_is_lost_is_handed_back_and_sent_once(mem, monkeypatch):
    # The lost probe's hold (a lease) must lapse before a worker probes again, and the worker
    # looks at the circuits every CIRCUIT_READ seconds: both shortened, to keep this fast.
    monkeypatch.setattr("evq.worker.runner.CIRCUIT_READ", 0.1)
    [step] = await enqueue(mem, 1)
    provider = Outage()

    class ProbeClaimAnswerLost:
        lost = 0

        def __getattr__(self, name):
            return getattr(mem, name)

        async def claim(self, **kwargs):
            claimed = await mem.claim(**kwargs)
            if kwargs.get("probe") and not self.lost:
                self.lost = len(claimed)
                raise DatabaseUnavailable("injected: the probe claim's answer was lost")
            return claimed

    lossy = ProbeClaimAnswerLost()
    worker = Worker(lossy, {"smtp": provider}, replace(SETTINGS, lease_seconds=1, rescue_interval=0.1))
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        await wait_until(lambda: events(mem)[:1] == [("closed", "open", "connection_refused")] or task.done())
        provider.up = True  # back: the probe would get through, but its claim's answer is lost
        await wait_until(lambda: lossy.lost == 1 or task.done())
        await wait_until(lambda: bool({"accepted", "unknown"} & set(statuses(mem))) or task.done())
    finally:
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
    assert (mem.steps[step]["status"], mem.steps[step]["reason"]) == ("accepted", "provider_accepted")
    assert list(provider.sent.values()) == [1]
    assert [e["kind"] for e in mem.evidence].count("attempt_released") == 1  # the lost probe, unsent
    assert mem.circuit_rows["smtp"]["state"] == "closed"


async def test_a_worker_stopped_as_it_takes_a_probe_gives_the_probe_back(mem):
    [step] = await enqueue(mem, 1)
    provider = Outage()

    class StopAsProbeIsClaimed:
        probes = 0

        def __getattr__(self, name):
            return getattr(mem, name)

        async def claim(self, **kwargs):
            claimed = await mem.claim(**kwargs)
            if kwargs.get("probe") and claimed:
                self.probes += 1
                worker.request_stop()
            return claimed

    stopping = StopAsProbeIsClaimed()
    worker = Worker(stopping, {"smtp": provider}, SETTINGS)
    assert await asyncio.wait_for(worker.run(install_signals=False), 10) == 0
    assert stopping.probes == 1 and mem.steps[step]["status"] == "retryable"
    c = mem.circuit_rows["smtp"]
    assert (c["state"], c["probe_owner"]) == ("open", None)
    assert events(mem)[-2:] == [("open", "half_open", "probe"), ("half_open", "open", "connection_refused")]
