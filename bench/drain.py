"""The drain and latency modes: steps batch-enqueued, then drained by real `evq worker` processes
through the null adapter (the real claim, attempt and outcome path, nothing sent)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import psycopg

from bench import footprint
from bench.children import evq_worker_spec, run_children, span
from bench.config import Figure
from evq.worker.errors import EvqError

if TYPE_CHECKING:
    from bench.harness import Bench


def drain_once(bench: Bench, processes: int, *, url: str | None = None, run_id: str = "bench") -> tuple[float, float]:
    """Steps/s and peak RSS of one drain of ``steps`` by ``processes`` workers (a fresh database
    unless ``url`` is given); the batch enqueue's write time is kept for the enqueue mode."""
    c = bench.config

    def measure(db_url: str) -> tuple[float, float]:
        write = bench.prefill.enqueue(db_url, c.steps, run_id=run_id)
        bench.batch_enqueue_seconds.append(write)
        with footprint.wal_kept(db_url):
            before = footprint.snapshot(db_url)
            results = run_children(
                [evq_worker_spec(db_url, concurrency=c.drain_concurrency, batch_size=c.batch_size)] * processes
            )
            after = footprint.snapshot(db_url)
            # This database's own WAL records when pg_walinspect is there (the server's position
            # counts every other session's writes too).
            wal = footprint.database_wal(db_url, before, after)
        bench.footprints.setdefault(processes, []).append(footprint.per_step(before, after, c.steps, wal=wal))
        check_drained(db_url, c.steps, run_id)
        return c.steps / span(results), max(r.rss_mb for r in results)

    if url is not None:
        return measure(url)
    with bench.db.fresh() as fresh:
        return measure(fresh)


def check_drained(url: str, expected: int, run_id: str = "bench") -> None:
    with psycopg.connect(url) as conn:
        done = conn.execute(
            "SELECT count(*) FROM email_steps WHERE status = 'accepted' AND run_id = %s", (run_id,)
        ).fetchone()[0]
    if done != expected:
        raise EvqError(f"benchmark drain left work behind: {done} of {expected} accepted")


def mode_drain(bench: Bench) -> None:
    bench.batch_enqueue_seconds = []
    for processes in bench.config.drain_processes:
        bench.footprints[processes] = []
        values, rss = bench.repeat(functools.partial(drain_once, bench, processes))
        label = f"evq drain, {processes} process{'es' if processes > 1 else ''}"
        bench.add(
            Figure(
                "drain",
                label,
                "steps/s",
                values,
                rss,
                note=f"concurrency {bench.config.drain_concurrency}, batch {bench.config.batch_size}, null adapter",
            )
        )
        add_footprint(bench, label, bench.footprints[processes])


# Per step of a drain, from PostgreSQL's counters (bench/footprint.py): name, unit, key, scale.
FOOTPRINT = (
    (
        "WAL per step",
        "bytes",
        "wal_bytes",
        1.0,
        "this database's WAL records (pg_walinspect), full-page images included",
    ),
    ("rows written per step", "rows", "rows", 1.0, "inserts, updates and deletes, every table (pg_stat_user_tables)"),
    (
        "index entries written per step",
        "entries",
        "index_entries",
        1.0,
        "each insert and non-HOT update, once per index of its table",
    ),
    ("HOT share of updates", "%", "hot_share", 100.0, "updates that wrote no index entry"),
)


def add_footprint(bench: Bench, label: str, runs: list[dict[str, float]]) -> None:
    if not runs:
        return
    for name, unit, key, scale, note in FOOTPRINT:
        if key == "wal_bytes" and any(r["wal_whose"] == "server" for r in runs):
            note = "the server's WAL position (no pg_walinspect): other sessions' writes count too"
        bench.add(Figure("drain", f"{label}: {name}", unit, [r[key] * scale for r in runs], note=note))


def mode_latency(bench: Bench) -> None:
    """Latency-bound: the null adapter answering after ``latency_delay``, one process, against
    the ideal ``concurrency / delay``."""
    c = bench.config
    for concurrency in c.latency_concurrency:
        n = concurrency * c.latency_waves

        # The loop's values are bound as defaults: a closure would read the variables, not this pass's values.
        def once(n: int = n, concurrency: int = concurrency) -> tuple[float, float]:
            with bench.db.fresh() as url:
                bench.prefill.enqueue(url, n)
                results = run_children(
                    [evq_worker_spec(url, concurrency=concurrency, batch_size=c.batch_size, delay=c.latency_delay)]
                )
                check_drained(url, n)
                return n / span(results), results[0].rss_mb

        values, rss = bench.repeat(once)
        ideal = concurrency / c.latency_delay
        fig = bench.add(
            Figure(
                "latency",
                f"evq latency-bound, concurrency {concurrency}",
                "steps/s",
                values,
                rss,
                note=f"null adapter answering after {c.latency_delay * 1000:g} ms, 1 process, {n} steps",
            )
        )
        fig.ratios["ideal"] = fig.median / ideal
