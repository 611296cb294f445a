"""The scale mode: the 1-process drain with a big history of terminal steps (and their evidence)
already present, against the empty-table drain; and the metrics collector's query at that size
(the one /metrics runs, QueueStatsReader)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import psycopg

from bench.config import Figure
from bench.drain import drain_once

if TYPE_CHECKING:
    from bench.harness import Bench


def mode_scale(bench: Bench) -> None:
    c = bench.config
    name = bench.db.create(bench.db.template)
    url = bench.db.url(name)
    try:
        started = time.perf_counter()
        fill_terminal(url, c.scale_rows)
        bench.notes.append(f"scale: {c.scale_rows:,} terminal rows made in {time.perf_counter() - started:.0f}s")
        values, rss = [], None
        for run in range(c.runs):
            # Each run's drained rows join the history: a run id of its own keeps the keys apart.
            value, run_rss = drain_once(bench, 1, url=url, run_id=f"scale{run}")
            values.append(value)
            rss = max(rss or 0, run_rss)
        drain = bench.add(
            Figure("scale", f"evq drain, 1 process, {c.scale_rows:,} terminal rows present", "steps/s", values, rss)
        )
        empty = bench.find("drain", "evq drain, 1 process")
        drain.ratios["empty_table"] = drain.median / empty.median if empty else None
        timings = time_collector(url, repeat=max(5, 3 * c.runs))
        bench.add(
            Figure(
                "scale",
                "metrics collector query",
                "ms",
                timings,
                note=f"QueueStatsReader (ops/app/metrics.py's query); {c.scale_rows:,} terminal rows",
            )
        )
    finally:
        bench.db.drop(name, at_once=True)


def time_collector(url: str, *, repeat: int) -> list[float]:
    """Milliseconds per read of the metrics collector's query (QueueStatsReader, as /metrics runs it)."""
    from evq.adapters.postgres.queue_stats import QueueStatsReader
    from evq.worker.metrics import UNKNOWN_AGE_BUCKETS

    reader = QueueStatsReader(url)
    try:
        reader.read(UNKNOWN_AGE_BUCKETS)  # connect and warm the cache, as a scrape every 15 s would
        timings = []
        for _ in range(repeat):
            started = time.perf_counter()
            reader.read(UNKNOWN_AGE_BUCKETS)
            timings.append((time.perf_counter() - started) * 1000)
        return timings
    finally:
        reader.close()


def fill_terminal(url: str, rows: int) -> None:
    """History: `rows` accepted steps, each with its decision and its two evidence rows,
    as the worker leaves them; then VACUUM ANALYZE, as autovacuum would."""
    chunk = 250_000
    with psycopg.connect(url, autocommit=True) as conn:
        for start in range(1, rows + 1, chunk):
            end = min(rows, start + chunk - 1)
            params = {"a": start, "b": end}
            conn.execute(
                "INSERT INTO decisions (id, run_id, step_id, intent, model, tool, created_at)"
                " SELECT g, 'hist-' || (g / 1000), 's' || g, 'history', 'm', 'send_email', now() - interval '30 days'"
                " FROM generate_series(%(a)s::bigint, %(b)s::bigint) g",
                params,
            )
            conn.execute(
                "INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider,"
                " payload, payload_sha256, status, reason, attempts, first_attempt_at, closed_at,"
                " provider_message_id, created_at, updated_at)"
                " SELECT 'hist-' || (g / 1000), 's' || g, g, 'hist:' || g, '<hist.' || g || '@example.org>', 'null',"
                " jsonb_build_object('to', jsonb_build_array(jsonb_build_object('email', 'u' || g || '@example.com')),"
                "   'subject', 'history ' || g, 'text', 'old message'), repeat('0', 64), 'accepted',"
                " 'provider_accepted', 1, now() - interval '30 days', now() - interval '30 days', 'null-' || g,"
                " now() - interval '30 days', now() - interval '30 days'"
                " FROM generate_series(%(a)s::bigint, %(b)s::bigint) g",
                params,
            )
            conn.execute(
                "INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, outcome,"
                " reason, lease_token, created_at)"
                " SELECT s.id, s.run_id, 1, k.kind, 'history', k.from_status, k.to_status, k.outcome, k.reason,"
                " gen_random_uuid(), s.created_at"
                " FROM email_steps s CROSS JOIN (VALUES ('attempt_started', 'pending', 'in_flight', NULL, NULL),"
                "   ('provider_response', 'in_flight', 'accepted', 'accepted', 'provider_accepted'))"
                "   AS k(kind, from_status, to_status, outcome, reason)"
                " WHERE s.decision_id BETWEEN %(a)s AND %(b)s",
                params,
            )
        conn.execute("SELECT setval(pg_get_serial_sequence('decisions', 'id'), %s)", (rows,))
        conn.execute("VACUUM ANALYZE")
