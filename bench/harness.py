"""evq bench: evq measured against the raw SQL ceiling and a peer queue, in one run.

Every figure is the median (and min-max) of repeated runs, and is also printed as
a ratio to the ceiling and the peer measured minutes earlier on the same machine:
on a shared, noisy machine the ratios hold much better than the absolute numbers.

This module runs the modes in order and assembles the report; each job has its module:

- config.py: what a run measures (BenchConfig) and one measured figure (Figure).
- databases.py: the scratch databases (a migrated template, a clone per run, all dropped).
- prefill.py: the benchmark's requests, validated once and batch-enqueued into each database.
- children.py and child.py: the worker processes, parent's and child's side
  (``python -m bench.child SPEC-JSON``): each one wires itself, says it is ready, and
  starts when told, so start-up is never timed; each reports its peak RSS.
- the modes (README, "Benchmark"): drain.py (drain: N steps drained by 1 and 2 worker processes
  through the null adapter; latency: the null adapter answering after 50 ms, concurrency
  50/200/500), enqueue.py (single enqueue through the Python API, in its own and in a caller's
  transaction; batch enqueue), pickup.py (enqueue-to-claim p50/p99 with LISTEN/NOTIFY and with
  polling only), scale.py (the drain with 1,000,000 terminal rows present, and the metrics
  collector's query at that size), ceiling.py (claim 100 rows with SKIP LOCKED and finish them
  with one batched UPDATE, and with one commit per row), peer.py (the peers of the optional
  ``bench`` extra, each round alternated with evq's drain: pgqueuer draining the same number of
  no-op jobs, pgqueuer with evidence rows (evidence_peer.py), DBOS Transact (dbos_peer.py);
  pgqueuer's single and batch enqueue),
  pages.py and pagefill.py (ops-pages, only when named: every /ops page's server time with a
  million steps in the database), retention.py (retention, only when named: evq prune by whole
  evidence partitions against row-by-row batches at 10,000,000 evidence rows, and claim and
  enqueue with few partitions against many).
- report.py: the ratios, the targets, the human table, the revision.

A figure that cannot be right (a negative, NaN or infinite latency, duration, rate or RSS) stops
the run with ImpossibleFigure naming it (config.py): never a figure that scores as met.

The benchmark creates its own databases on the server it is pointed at (it needs CREATE
DATABASE) and drops them afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import psycopg

from bench import ceiling, dbos_peer, drain, enqueue, pages, peer, pickup, report, retention, scale
from bench.config import BenchConfig, Figure
from bench.databases import Databases
from bench.modes import MODES
from bench.prefill import Prefill
from bench.report import human

# What `evq bench` (ops/cli/bench.py) and the tests take from here.
__all__ = ["MODES", "Bench", "BenchConfig", "Figure", "human"]

# Each mode's measurement, by the name `--mode` takes (bench/modes.py gives the order).
MEASURE: dict[str, Callable[[Bench], None]] = {
    "drain": drain.mode_drain,
    "latency": drain.mode_latency,
    "enqueue": enqueue.mode_enqueue,
    "pickup": pickup.mode_pickup,
    "scale": scale.mode_scale,
    "ceiling": ceiling.mode_ceiling,
    "peer": peer.mode_peer,
    "ops-pages": pages.mode_ops_pages,
    "retention": retention.mode_retention,
}


class Bench:
    """One run: the state the modes share (the databases, the prefill, the figures so far)."""

    def __init__(self, config: BenchConfig, *, progress: Callable[[str], None] = lambda _: None):
        self.config = config.validate()
        self.progress = progress
        self.db = Databases(config.server_url)
        self.prefill = Prefill()
        self.figures: list[Figure] = []
        self.notes: list[str] = []
        self.peer_driver: str | None = None
        self.dbos_version: str | None = None  # DBOS Transact, measured by the peer mode when installed
        # The drain mode's batch enqueues: the enqueue mode reports them instead of timing its own.
        self.batch_enqueue_seconds: list[float] = []
        # The drain mode's per-step database figures (bench/footprint.py), by process count.
        self.footprints: dict[int, list[dict[str, float]]] = {}
        # The ops-pages mode's table (bench/pages.py), when it ran.
        self.pages: dict[str, Any] | None = None

    def run(self) -> dict[str, Any]:
        load_before = os.getloadavg()
        started = time.perf_counter()
        try:
            self.db.migrated_template()
            self.peer_driver = peer.driver(self)
            self.dbos_version = dbos_peer.available(self) if self.peer_driver else None
            for mode in MODES:
                if mode in self.config.modes:
                    self.progress(f"{mode}...")
                    MEASURE[mode](self)
        finally:
            self.db.drop_all()
        report.add_ratios(self.figures)
        out = {
            "revision": report.git_revision(),
            "config": {k: v for k, v in asdict(self.config).items() if k != "server_url"},
            "machine": {
                "cpus": os.cpu_count(),
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
                "postgres": self._server_version(),
                "peer": self.peer_driver and f"pgqueuer {peer.version()} ({self.peer_driver})",
                "dbos": self.dbos_version,
            },
            "seconds": round(time.perf_counter() - started, 1),
            "results": [f.to_dict() for f in self.figures],
            "targets": report.targets(self.figures) + report.page_targets(self.pages),
            "notes": self.notes,
        }
        if self.pages is not None:
            out["pages"] = self.pages
        return out

    def _server_version(self) -> str:
        with psycopg.connect(self.config.server_url, connect_timeout=10) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def find(self, mode: str, prefix: str) -> Figure | None:
        return report.find(self.figures, mode, prefix)

    def repeat(self, once: Callable[[], tuple[float, float | None]]) -> tuple[list[float], float | None]:
        """``once`` run ``runs`` times: its values, and the highest peak RSS any run reported."""
        values, rss = [], None
        for _ in range(self.config.runs):
            value, run_rss = once()
            values.append(value)
            if run_rss is not None:
                rss = max(rss or 0.0, run_rss)
        return values, rss
