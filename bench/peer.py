"""The peers: what a user would run instead of evq, measured beside it in the same run (the optional
``bench`` extra: pip install 'evq[bench]').

- pgqueuer draining no-op jobs: a bare queue that proves nothing;
- pgqueuer with evidence (bench/evidence_peer.py): its handler commits an attempt row before
  the send and an outcome row after it, each in its own transaction, as a careful user would;
- DBOS Transact (bench/dbos_peer.py): a queue, one workflow per email, one step that "sends".

Each is drained with the same N as evq, in worker processes of its own (bench/child.py),
in two settings: pgqueuer's default (1 process, batch 10) and its best (2 processes, batch 50,
task cap 100; DBOS: the same processes, 100 workflows at once per process). Each round of the
peer mode drains evq with the same number of processes first, then every peer, so each ratio
is the median of the rounds' own ratios: a burst of load on a shared machine hits a round of
all of them, not one system. pgqueuer's single and batch enqueue are measured here too, or by
the enqueue mode, paired with evq's, when that runs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg

from bench import dbos_peer, evidence_peer
from bench.children import run_children, span
from bench.config import Figure
from bench.drain import drain_once
from evq.worker.errors import ConfigError, EvqError

if TYPE_CHECKING:
    from bench.harness import Bench


def driver(bench: Bench) -> str | None:
    """The driver pgqueuer will use here, or None when the peer is off or not installed (a note says so)."""
    if bench.config.peer == "off" or not ({"peer", "enqueue"} & set(bench.config.modes)):
        return None
    try:
        import pgqueuer  # noqa: F401
    except ImportError:
        if bench.config.peer == "on":
            raise ConfigError("pgqueuer is not installed", hint="pip install 'evq[bench]'") from None
        bench.notes.append("pgqueuer is not installed (pip install 'evq[bench]'): peer figures and ratios omitted")
        return None
    try:
        import asyncpg  # noqa: F401

        return "asyncpg"
    except ImportError:
        return "psycopg"


@dataclass(frozen=True)
class Setting:
    """One of pgqueuer's settings, and the evq drain paired with it."""

    key: str  # the ratios' suffix: default or best
    processes: int
    batch: int
    cap: int | None

    @property
    def label(self) -> str:
        cap = f", task cap {self.cap}" if self.cap else ""
        return f"{self.processes} process{'es' if self.processes > 1 else ''}, batch {self.batch}{cap}"


SETTINGS = (Setting("default", 1, 10, None), Setting("best", 2, 50, 100))


def mode_peer(bench: Bench) -> None:
    if bench.peer_driver is None:
        return
    c = bench.config
    for s in SETTINGS:
        systems: dict[str, tuple[str, Any]] = {
            f"pgqueuer_{s.key}": (
                f"pgqueuer drain, {s.key} ({s.label})",
                lambda s=s: pgqueuer_drain(bench, s, evidence=False),
            ),
            f"pgqueuer_evidence_{s.key}": (
                f"pgqueuer with evidence drain, {s.key} ({s.label})",
                lambda s=s: pgqueuer_drain(bench, s, evidence=True),
            ),
        }
        if bench.dbos_version is not None:
            systems[f"dbos_{s.key}"] = (
                f"DBOS Transact drain, {s.key} ({s.processes} process{'es' if s.processes > 1 else ''}, "
                f"{dbos_peer.WORKER_CONCURRENCY} workflows at once each)",
                lambda s=s: dbos_peer.drain_once(bench, s.processes),
            )
        evq: list[tuple[float, float]] = []
        runs: dict[str, list[tuple[float, float]]] = {key: [] for key in systems}
        for _ in range(c.runs):  # a round: evq, then every peer, back to back
            evq.append(drain_once(bench, s.processes))
            for key, (_, once) in systems.items():
                runs[key].append(once())
        paired = bench.add(
            Figure(
                "peer",
                f"evq drain, {s.processes} process{'es' if s.processes > 1 else ''}, alternated with the peers",
                "steps/s",
                [v for v, _ in evq],
                max(r for _, r in evq),
                note=f"concurrency {c.drain_concurrency}, batch {c.batch_size}, null adapter; in each round before "
                "the peers",
            )
        )
        for key, (label, _) in systems.items():
            values = [v for v, _ in runs[key]]
            what = "workflows/s" if key.startswith("dbos") else "jobs/s"
            note = {
                "pgqueuer": f"{c.steps} no-op jobs, {bench.peer_driver}",
                "pgqueuer_evidence": f"{c.steps} jobs, an attempt and an outcome row each in its own transaction, "
                f"{bench.peer_driver}, pool {evidence_peer.POOL_SIZE} per process",
                "dbos": f"{c.steps} workflows of one no-op step, dbos {bench.dbos_version}",
            }[key.rsplit("_", 1)[0]]
            fig = bench.add(Figure("peer", label, what, values, max(r for _, r in runs[key]), note=note))
            # How many times the peer's rate evq drains at: each round's own ratio, their median.
            ratio = statistics.median(e / p for (e, _), (p, _) in zip(evq, runs[key], strict=True))
            paired.ratios[key] = ratio
            fig.ratios["evq"] = ratio
    if bench.find("peer", "pgqueuer single") is None:  # the enqueue mode measures it when it runs
        add_enqueue_figures(bench, [enqueue_once(bench) for _ in range(c.runs)], None)


def pgqueuer_drain(bench: Bench, s: Setting, *, evidence: bool) -> tuple[float, float]:
    """Jobs/s and peak RSS of one pgqueuer drain of N jobs in a fresh database."""
    assert bench.peer_driver is not None
    n = bench.config.steps
    name = bench.db.create()
    url = bench.db.url(name)
    try:
        asyncio.run(pgqueuer_setup(url, bench.peer_driver, n))
        if evidence:
            evidence_peer.create_table(url)
        spec = {
            "kind": "pgqueuer",
            "url": url,
            "driver": bench.peer_driver,
            "batch_size": s.batch,
            "max_concurrent_tasks": s.cap,
            "expected": n,
            "evidence": evidence,
        }
        results = run_children([spec] * s.processes)
        if sum(r.detail["jobs"] for r in results) != n:
            raise EvqError("pgqueuer drain did not run every job")
        if evidence:
            evidence_peer.check(url, n)
        return n / span(results), max(r.rss_mb for r in results)
    finally:
        bench.db.drop(name)


# pgqueuer's enqueue: a run's single-enqueue rate, its single-enqueue p50 (ms), its batch rate.
EnqueueRun = tuple[float, float, float]


def enqueue_once(bench: Bench) -> EnqueueRun:
    """pgqueuer's single and batch enqueue, in a fresh database."""
    assert bench.peer_driver is not None
    c = bench.config
    name = bench.db.create()
    try:
        return asyncio.run(pgqueuer_enqueue(bench.db.url(name), bench.peer_driver, c.enqueue_single, c.steps))
    finally:
        bench.db.drop(name)


def add_enqueue_figures(bench: Bench, runs: list[EnqueueRun], how: str | None) -> None:
    c, when = bench.config, f", {how}" if how else ""
    bench.add(
        Figure("peer", "pgqueuer single enqueue", "jobs/s", [r[0] for r in runs], note=f"{c.enqueue_single} jobs{when}")
    )
    bench.add(
        Figure(
            "peer",
            "pgqueuer single enqueue p50",
            "ms",
            [r[1] for r in runs],
            note=f"each call's time, {c.enqueue_single} jobs{when}",
        )
    )
    bench.add(
        Figure(
            "peer", "pgqueuer batch enqueue", "jobs/s", [r[2] for r in runs], note=f"{c.steps} jobs in one call{when}"
        )
    )


async def connect(url: str, driver: str) -> Any:
    if driver == "asyncpg":
        import asyncpg
        from pgqueuer import AsyncpgDriver

        info = psycopg.conninfo.conninfo_to_dict(url)
        keys = {"host": "host", "port": "port", "user": "user", "password": "password", "dbname": "database"}
        return AsyncpgDriver(await asyncpg.connect(**{keys[k]: v for k, v in info.items() if k in keys}))
    from pgqueuer import PsycopgDriver

    return PsycopgDriver(await psycopg.AsyncConnection.connect(url, autocommit=True))


async def pgqueuer_setup(url: str, driver: str, n: int) -> None:
    from pgqueuer import Queries

    queries = Queries(await connect(url, driver))
    await queries.install()
    await queries.enqueue(["bench"] * n, [b""] * n, [0] * n)


async def pgqueuer_enqueue(url: str, driver: str, single: int, batch: int) -> EnqueueRun:
    from pgqueuer import Queries

    queries = Queries(await connect(url, driver))
    await queries.install()
    calls = []
    started = time.perf_counter()
    for _ in range(single):
        call = time.perf_counter()
        await queries.enqueue("bench", b"", 0)
        calls.append(time.perf_counter() - call)
    single_rate = single / (time.perf_counter() - started)
    started = time.perf_counter()
    await queries.enqueue(["bench"] * batch, [b""] * batch, [0] * batch)
    return single_rate, statistics.median(calls) * 1000, batch / (time.perf_counter() - started)


def version() -> str:
    try:
        from importlib.metadata import version as installed

        return installed("pgqueuer")
    except Exception:
        return "?"
