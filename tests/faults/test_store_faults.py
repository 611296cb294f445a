"""Failure matrix row 16: any store call may fail, with any exception class, before it ran or
after (its answer lost). For every N of a small run, the Nth store call fails; the run uses
the real PostgreSQL store and a real SMTP sink (ops/dev/smtp.py). Whatever fails, the sink
receives each message at most once, no evidence says "never sent" (``attempt_released``)
about a message the sink had already received, and every step ends in a true state: one
fault that the database recovers from leaves every message accepted and delivered once.

The sweep also runs each N with a second fault: the first claim after call N commits and
then loses its connection (the orphan check runs), which is how an unexpected error while
recording turned into a duplicate send behind PgBouncer.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerr

from evq.adapters.postgres.database import translate
from evq.adapters.postgres.store import PostgresStore
from evq.adapters.smtp import SmtpProvider
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.runner import Worker
from tests.clones import Dropper
from tests.support import rows, valid

MESSAGES = 4
SETTINGS = Settings(
    adapter=("smtp",),
    concurrency=2,
    batch_size=2,
    lease_seconds=30,
    poll_interval=0.02,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.3,
    shutdown_grace=5,
    smtp_timeout=5,
    listen="off",
)
# What a store call can raise: unclassified errors a pooler or a bug produces, and errors that
# read as "the database is away" (the store translates those, as it would a real one).
ERRORS: list[type[Exception]] = [
    RuntimeError,
    pgerr.InvalidSqlStatementName,
    psycopg.OperationalError,
    pgerr.DuplicatePreparedStatement,
    pgerr.AdminShutdown,
    KeyError,
]


@dataclass
class Fault:
    """Fail the first store call numbered ``at`` or later (of ``method``, if given), once."""

    at: int
    error: type[Exception]
    after: bool  # the call ran (and committed); only its answer is lost
    method: str | None = None
    fired: str | None = None

    def raised(self) -> Exception:
        exc = self.error(f"injected fault ({self.error.__name__})")
        return translate(exc) or exc


class FaultyStore:
    """The real store; the calls that match a fault raise instead of answering."""

    def __init__(self, store: PostgresStore, faults: list[Fault]):
        self.store = store
        self.faults = faults
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.store, name)
        if not asyncio.iscoroutinefunction(real):
            return real

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            n = len(self.calls)
            fault = next(
                (f for f in self.faults if f.fired is None and n >= f.at and (f.method is None or f.method == name)),
                None,
            )
            if fault is not None:
                fault.fired = f"call {n} ({name}) {'after' if fault.after else 'before'} it ran"
                if not fault.after:
                    raise fault.raised()
            result = await real(*args, **kwargs)
            if fault is not None:
                raise fault.raised()
            return result

        return call


@dataclass
class Case:
    faults: list[Fault]
    violations: list[str] = field(default_factory=list)
    calls: int = 0

    def describe(self) -> str:
        return "; ".join(f"{f.error.__name__} at {f.fired or f'#{f.at} (never reached)'}" for f in self.faults)


@asynccontextmanager
async def fresh_database(pg_server: str, template: str, name: str, dropper: Dropper) -> AsyncIterator[str]:
    """A clone of the template for one case, dropped with the session's next batch (a drop waits
    for a checkpoint; the sweep's drops together share one, as tests/clones.py does)."""
    async with await psycopg.AsyncConnection.connect(pg_server, autocommit=True) as conn:
        # The default strategy (WAL_LOG), as tests/clones.py: FILE_COPY costs two checkpoints.
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    info = psycopg.conninfo.conninfo_to_dict(pg_server)
    info["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo(**info)
    finally:
        dropper.give_back(name)


async def run_case(url: str, sink: DevSmtpServer, case: Case) -> None:
    store = await PostgresStore.open(url, max_size=3)
    provider = SmtpProvider(host=sink.host, port=sink.port, timeout=5, policy=SETTINGS.policy())
    try:
        for i in range(MESSAGES):
            await store.enqueue(valid(run_id="faults", step_id=f"m{i}", to=[f"u{i}@example.com"]))
        faulty = FaultyStore(store, case.faults)
        worker = Worker(faulty, {"smtp": provider}, SETTINGS.worker_config())
        try:
            code = await asyncio.wait_for(worker.run(drain=True, install_signals=False), 20)
            if code != 0:
                case.violations.append(f"the worker exited {code}")
        except TimeoutError:
            case.violations.append("the worker did not drain within 20 s")
        except Exception as exc:  # a worker that dies of a store error is a finding
            case.violations.append(f"the worker died: {type(exc).__name__}: {exc}")
        case.calls = len(faulty.calls)
    finally:
        await provider.close()
        await store.close()
    check(url, sink, case)


def check(url: str, sink: DevSmtpServer, case: Case) -> None:
    received: dict[str, list[datetime]] = {}
    # The sink is shared by cases run side by side; Message-IDs are unique to each step.
    for m in sink.messages:
        received.setdefault(m["message_id"], []).append(m["received_at"])
    steps = rows(url, "SELECT id, step_id, status, reason, message_id FROM steps_now ORDER BY id")
    released = rows(url, "SELECT step_id, created_at FROM evidence WHERE kind = 'attempt_released'")
    for step in steps:
        got = received.get(step["message_id"], [])
        name = f"{step['step_id']} ({step['status']}/{step['reason']})"
        if len(got) > 1:
            case.violations.append(f"{name}: the sink received it {len(got)} times")
        if step["status"] == "accepted" and len(got) != 1:
            case.violations.append(f"{name}: accepted, but the sink received it {len(got)} times")
        if step["status"] in ("pending", "retryable", "rejected") and got:
            case.violations.append(f"{name}: says not sent, but the sink received it")
        if step["status"] == "in_flight":
            case.violations.append(f"{name}: left in flight after the worker drained (a send forgotten)")
        if step["status"] != "accepted":
            # The sink answered every send and the database recovered: nothing may be left
            # to an operator or lost.
            case.violations.append(f"{name}: ended {step['status']}, not accepted")
        for r in released:
            if r["step_id"] == step["id"] and got and r["created_at"] > min(got):
                case.violations.append(f"{name}: attempt_released (never sent) written after the sink received it")


def plans(calls: int) -> Iterator[list[Fault]]:
    errors = itertools.cycle(ERRORS)
    for n in range(1, calls + 1):
        yield [Fault(n, next(errors), after=False)]
        yield [Fault(n, next(errors), after=True)]
        yield [Fault(n, next(errors), after=False), Fault(n + 1, psycopg.OperationalError, after=True, method="claim")]


async def sweep(
    pg_server: str, template: str, sink: DevSmtpServer, calls: int, dropper: Dropper
) -> tuple[int, list[str]]:
    cases = [Case(faults) for faults in plans(calls)]
    # A few cases side by side (each its own database and worker): they mostly wait.
    gate = asyncio.Semaphore(3)

    async def one(i: int, case: Case) -> None:
        async with gate, fresh_database(pg_server, template, f"evq_sf_{os.getpid()}_{i}", dropper) as url:
            await run_case(url, sink, case)

    await asyncio.gather(*(one(i, case) for i, case in enumerate(cases)))
    return len(cases), [f"{case.describe()}: {case.violations}" for case in cases if case.violations]


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_store_error_of_any_class_at_any_call_never_sends_twice_or_lies(pg_server, template_db, _dropper):
    with DevSmtpServer() as sink:
        async with fresh_database(pg_server, template_db, f"evq_sf_{os.getpid()}_clean", _dropper) as url:
            clean = Case([])
            await run_case(url, sink, clean)
        assert clean.violations == [], clean.violations
        # Faults add calls (retries, the orphan check): sweep a little past a clean run.
        cases, failed = await sweep(pg_server, template_db, sink, clean.calls + 2, _dropper)
    assert cases >= 3 * clean.calls
    assert failed == [], f"{len(failed)} of {cases} runs broke a promise:\n" + "\n".join(failed)


class StopAsClaimIsLost:
    """The real store; the first claim that gets rows commits, then its answer is lost (the
    database went away), and at that moment the worker is told to stop, as SIGTERM does."""

    def __init__(self, store: PostgresStore):
        self.store = store
        self.worker: Worker | None = None
        self.lost: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def claim(self, **kwargs: Any) -> Any:
        claimed = await self.store.claim(**kwargs)
        if claimed and not self.lost:
            self.lost = [step.id for step in claimed]
            assert self.worker is not None
            self.worker.request_stop()
            raise translate(psycopg.OperationalError("injected: the claim's answer was lost"))
        return claimed


async def test_a_stop_asked_while_a_claims_answer_is_lost_hands_its_rows_back(db_url):
    """Row 2b at shutdown: the rows of a claim whose answer was lost were never sent. A
    worker stopped before its next claim or rescuer pass hands them back within its grace;
    a worker started later could not name them, and they would be rescued as unknown."""
    with DevSmtpServer() as sink:
        store = await PostgresStore.open(db_url, max_size=2)
        provider = SmtpProvider(host=sink.host, port=sink.port, timeout=5, policy=SETTINGS.policy())
        try:
            for i in range(MESSAGES):
                await store.enqueue(valid(run_id="stop", step_id=f"m{i}", to=[f"u{i}@example.com"]))
            lossy = StopAsClaimIsLost(store)
            worker = lossy.worker = Worker(lossy, {"smtp": provider}, SETTINGS.worker_config())
            assert await asyncio.wait_for(worker.run(install_signals=False), 20) == 0
        finally:
            await provider.close()
            await store.close()
        assert sink.messages == []
    assert len(lossy.lost) == SETTINGS.batch_size
    got = rows(db_url, "SELECT id, status FROM steps_now WHERE id = ANY(%s) ORDER BY id", (lossy.lost,))
    assert [r["status"] for r in got] == ["pending"] * len(lossy.lost), got
    released = rows(db_url, "SELECT count(*) AS n FROM evidence WHERE kind = 'attempt_released'")[0]["n"]
    assert released == len(lossy.lost)
