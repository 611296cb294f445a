"""The peer: pgqueuer (the optional ``bench`` extra) measured beside evq in the same run.

The peer mode drains the same number of no-op jobs with pgqueuer's default and best settings,
each consumer a worker process of its own (ops/bench/child.py); pgqueuer's single and batch
enqueue are measured here too, or by the enqueue mode, paired with evq's, when that runs.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import psycopg

from evq.ops.bench.children import run_children, span
from evq.ops.bench.config import Figure
from evq.worker.errors import ConfigError, EvqError

if TYPE_CHECKING:
    from evq.ops.bench.harness import Bench


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


def mode_peer(bench: Bench) -> None:
    if bench.peer_driver is None:
        return
    c = bench.config
    configs = (
        ("pgqueuer drain, default (1 process, batch 10)", 1, 10, None),
        ("pgqueuer drain, best (2 processes, batch 50, task cap 100)", 2, 50, 100),
    )
    for label, processes, batch, cap in configs:

        def once(processes: int = processes, batch: int = batch, cap: int | None = cap) -> tuple[float, float]:
            name = bench.db.create()
            url = bench.db.url(name)
            try:
                asyncio.run(pgqueuer_setup(url, bench.peer_driver, c.steps))
                spec = {
                    "kind": "pgqueuer",
                    "url": url,
                    "driver": bench.peer_driver,
                    "batch_size": batch,
                    "max_concurrent_tasks": cap,
                    "expected": c.steps,
                }
                results = run_children([spec] * processes)
                if sum(r.detail["jobs"] for r in results) != c.steps:
                    raise EvqError("pgqueuer drain did not run every job")
                return c.steps / span(results), max(r.rss_mb for r in results)
            finally:
                bench.db.drop(name)

        values, rss = bench.repeat(once)
        bench.add(Figure("peer", label, "jobs/s", values, rss, note=f"{c.steps} no-op jobs, {bench.peer_driver}"))
    if bench.find("peer", "pgqueuer single") is None:  # the enqueue mode measures it when it runs
        add_enqueue_figures(bench, [enqueue_once(bench) for _ in range(c.runs)], None)


def enqueue_once(bench: Bench) -> tuple[float, float]:
    """pgqueuer's single and batch enqueue rates, in a fresh database."""
    assert bench.peer_driver is not None
    c = bench.config
    name = bench.db.create()
    try:
        return asyncio.run(pgqueuer_enqueue(bench.db.url(name), bench.peer_driver, c.enqueue_single, c.steps))
    finally:
        bench.db.drop(name)


def add_enqueue_figures(bench: Bench, runs: list[tuple[float, float]], how: str | None) -> None:
    c, when = bench.config, f", {how}" if how else ""
    bench.add(
        Figure("peer", "pgqueuer single enqueue", "jobs/s", [s for s, _ in runs], note=f"{c.enqueue_single} jobs{when}")
    )
    bench.add(
        Figure(
            "peer",
            "pgqueuer batch enqueue",
            "jobs/s",
            [b for _, b in runs],
            note=f"{c.steps} jobs in one call{when}",
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


async def pgqueuer_enqueue(url: str, driver: str, single: int, batch: int) -> tuple[float, float]:
    from pgqueuer import Queries

    queries = Queries(await connect(url, driver))
    await queries.install()
    started = time.perf_counter()
    for _ in range(single):
        await queries.enqueue("bench", b"", 0)
    single_rate = single / (time.perf_counter() - started)
    started = time.perf_counter()
    await queries.enqueue(["bench"] * batch, [b""] * batch, [0] * batch)
    return single_rate, batch / (time.perf_counter() - started)


def version() -> str:
    try:
        from importlib.metadata import version as installed

        return installed("pgqueuer")
    except Exception:
        return "?"
