"""Spawn to first claim: a worker process started from nothing (`evq worker run --drain`, the
command an operator runs, its imports, settings, start-up checks and pool included) to the
moment its first claim took a step; against a pgqueuer consumer process started the same way
(bench/child.py, its entrypoint's first job), each run alternated.

evq's claim time is the step's own first_attempt_at (the claim's transaction, the server's clock,
the same host's); pgqueuer's is the child's clock when its entrypoint runs. Bytecode: a checkout
run with PYTHONDONTWRITEBYTECODE (as this machine's environment sets) compiles every evq module
at every start while the installed peers' are compiled at install; the children here may write
it, and one untimed start of each comes first, so both start as an installed package would."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import psycopg

from bench.children import Child, child_environment
from bench.config import Figure
from evq.worker.errors import EvqError

if TYPE_CHECKING:
    from bench.harness import Bench


def _environment(extra: dict[str, str]) -> tuple[str, dict[str, str]]:
    cwd, env = child_environment()
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return cwd, {**env, **extra}


def evq_spawn_once(bench: Bench) -> float:
    """Seconds from starting `evq worker run --drain` to its first claim (one step waiting)."""
    with bench.db.fresh() as url:
        bench.prefill.enqueue(url, 1, run_id="spawn")
        cwd, env = _environment(
            {"EVQ_DATABASE_URL": url, "EVQ_ADAPTER": "null", "EVQ_LISTEN": "off", "EVQ_LOG_FORMAT": "json"}
        )
        started = time.time()
        done = subprocess.run(
            [sys.executable, "-c", "from evq.ops.cli import main; main()", "worker", "run", "--drain"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise EvqError("spawn: `evq worker run --drain` failed", context={"stderr": done.stderr[-2000:]})
        with psycopg.connect(url) as conn:
            [claimed] = conn.execute("SELECT first_attempt_at FROM steps_now WHERE run_id = 'spawn'").fetchone()
    if claimed is None:
        raise EvqError("spawn: the worker never claimed its step")
    return claimed.timestamp() - started


def pgqueuer_spawn_once(bench: Bench) -> float:
    """Seconds from starting a pgqueuer consumer process to its entrypoint's first job."""
    from bench.peer import pgqueuer_setup

    assert bench.peer_driver is not None
    name = bench.db.create()
    url = bench.db.url(name)
    try:
        asyncio.run(pgqueuer_setup(url, bench.peer_driver, 1))
        spec = {
            "kind": "pgqueuer",
            "url": url,
            "driver": bench.peer_driver,
            "batch_size": 10,
            "max_concurrent_tasks": 20,  # pgqueuer wants at least twice the batch
            "expected": 1,
            "evidence": False,
            "spawn": True,
        }
        _, env = _environment({})
        started = time.time()
        child = Child(spec, env=env)
        result = child.result(timeout=120)
        return float(result.detail["first_job_at"]) - started
    finally:
        bench.db.drop(name)


def measure(bench: Bench) -> None:
    """Both, alternated; one untimed start of each first (bytecode written, caches warm)."""
    runs = max(3, bench.config.runs)
    peer = bench.peer_driver is not None
    evq_spawn_once(bench)
    if peer:
        pgqueuer_spawn_once(bench)
    evq_values, peer_values = [], []
    for _ in range(runs):
        evq_values.append(evq_spawn_once(bench))
        if peer:
            peer_values.append(pgqueuer_spawn_once(bench))
    fig = bench.add(
        Figure(
            "pickup",
            "evq spawn to first claim",
            "s",
            evq_values,
            note="`evq worker run --drain` started, to its first claim (the step's first_attempt_at)",
        )
    )
    if peer:
        bench.add(
            Figure(
                "peer",
                "pgqueuer spawn to first job",
                "s",
                peer_values,
                note="a consumer process started, to its entrypoint's first job; alternated with evq's",
            )
        )
        fig.ratios["pgqueuer_spawn"] = statistics.median(e / p for e, p in zip(evq_values, peer_values, strict=True))
