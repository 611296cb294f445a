"""Time the metrics collector's query on a big table: `python -m bench.collector`.

By default it creates a scratch database on the server of ``--database-url``, migrates
it, fills it with 1,000,000 terminal rows and a live backlog in every state, and prints
one JSON object: the query's time (median, min, max over ``--repeat`` reads), the
counts it returned and which of them were estimated. ``--in-place`` measures the given
database as it is (the benchmark of issue 8 fills its own). Raw SQL is fine here:
this is a tool, not a runtime path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

import psycopg

from evq.adapters.postgres.queue_stats import QueueStatsReader
from evq.worker.metrics import UNKNOWN_AGE_BUCKETS

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"

# Live rows: a backlog a healthy queue could plausibly carry, in every live state.
LIVE = {
    "pending_due": 200,
    "pending_later": 100,
    "retryable_backoff": 100,
    "in_flight": 50,
    "expired": 5,
    "unknown": 40,
}

_FILL = """
WITH d AS (
    INSERT INTO decisions (run_id, step_id, intent) VALUES ('bench', %(tag)s::text, 'collector benchmark') RETURNING id
), s AS (
    -- In flight is a lease on the queue row; the step's row keeps pending (docs/design.md, "The queue").
    INSERT INTO email_steps (
        run_id, step_id, decision_id, idempotency_key, message_id, provider, payload, payload_sha256,
        status, reason, attempts, first_attempt_at, next_attempt_at,
        unknown_since, closed_at, created_at, updated_at
    )
    SELECT 'bench', %(tag)s::text || g, d.id, 'bench:' || %(tag)s::text || g,
           '<' || %(tag)s::text || g || '@bench.example>', 'smtp',
           jsonb_build_object('to', jsonb_build_array(jsonb_build_object('email', 'u' || g || '@example.com')),
                              'subject', 'benchmark row ' || g, 'text', 'hello'),
           repeat('0', 64),
           CASE WHEN %(status)s::text = 'in_flight' THEN 'pending' ELSE %(status)s::text END, NULL,
           CASE WHEN %(status)s::text IN ('pending', 'in_flight') THEN 0 ELSE 1 END,
           CASE WHEN %(status)s::text IN ('pending', 'in_flight') THEN NULL
                ELSE now() - make_interval(secs => g %% 86400) END,
           now() + make_interval(secs => %(due_in)s),
           CASE WHEN %(status)s::text = 'unknown' THEN now() - make_interval(secs => g * 997 %% 604800) END,
           CASE WHEN %(status)s::text IN ('accepted', 'rejected') THEN now() - make_interval(secs => g %% 86400) END,
           now() - make_interval(secs => g %% 604800), now()
    FROM d, generate_series(1, %(n)s) AS g
    RETURNING id, provider, status, attempts, first_attempt_at, next_attempt_at
)
INSERT INTO step_queue (id, provider, next_attempt_at, attempts, first_attempt_at, lease_owner, lease_token,
                        lease_expires_at)
SELECT s.id, s.provider, s.next_attempt_at,
       CASE WHEN %(status)s::text = 'in_flight' THEN 1 ELSE s.attempts END,
       CASE WHEN %(status)s::text = 'in_flight' THEN now() ELSE s.first_attempt_at END,
       CASE WHEN %(status)s::text = 'in_flight' THEN 'bench-worker' END,
       CASE WHEN %(status)s::text = 'in_flight' THEN gen_random_uuid() END,
       CASE WHEN %(status)s::text = 'in_flight' THEN now() + make_interval(secs => %(lease_in)s) END
FROM s
WHERE s.status IN ('pending', 'retryable')
"""


def fill(url: str, *, terminal: int, live: dict[str, int] | None = None) -> dict[str, int]:
    """Insert ``terminal`` closed rows (9 in 10 accepted) and a live backlog; VACUUM ANALYZE.

    Returns the rows inserted per status.
    """
    live = LIVE if live is None else live
    batches = [
        ("accepted", terminal - terminal // 10, 0, 0),
        ("rejected", terminal // 10, 0, 0),
        ("pending", live["pending_due"], -30, 0),
        ("pending", live["pending_later"], 3600, 0),
        ("retryable", live["retryable_backoff"], 600, 0),
        ("in_flight", live["in_flight"], 0, 120),
        ("in_flight", live["expired"], 0, -60),
        ("unknown", live["unknown"], 0, 0),
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        for i, (status, n, due_in, lease_in) in enumerate(batches):
            if n:
                conn.execute(_FILL, {"tag": f"b{i}-", "status": status, "n": n, "due_in": due_in, "lease_in": lease_in})
        # Index-only scans need the visibility map; the planner needs statistics.
        conn.execute("VACUUM ANALYZE email_steps")
        conn.execute("VACUUM ANALYZE step_queue")
    totals: dict[str, int] = {}
    for status, n, _, _ in batches:
        totals[status] = totals.get(status, 0) + n
    return totals


def measure(url: str, *, repeat: int = 20) -> dict[str, Any]:
    reader = QueueStatsReader(url, timeout=10.0)
    try:
        stats = reader.read(UNKNOWN_AGE_BUCKETS)  # connect and warm the cache first
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            stats = reader.read(UNKNOWN_AGE_BUCKETS)
            times.append((time.perf_counter() - started) * 1000.0)
    finally:
        reader.close()
    return {
        "query_ms": {
            "median": round(statistics.median(times), 2),
            "min": round(min(times), 2),
            "max": round(max(times), 2),
        },
        "repeat": repeat,
        "steps": stats.steps,
        "estimated": list(stats.estimated),
        "unknown_oldest_age_seconds": round(stats.unknown_oldest_age, 1),
        "pending_oldest_age_seconds": round(stats.pending_oldest_age, 1),
        "in_flight_expired": stats.in_flight_expired,
    }


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new database at evq's head revision on the same server, dropped afterwards."""
    from evq.adapters.postgres.database import upgrade

    name = f"evq_collector_bench_{os.getpid()}"
    info = psycopg.conninfo.conninfo_to_dict(server_url)
    url = psycopg.conninfo.make_conninfo(**{**info, "dbname": name})
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.collector", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get("EVQ_DATABASE_URL") or DEFAULT_SERVER,
        help="a server whose user may CREATE DATABASE (or, with --in-place, the evq database to measure)",
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="terminal rows to fill (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=20, help="timed reads (default 20)")
    parser.add_argument("--in-place", action="store_true", help="measure --database-url as it is; fill nothing")
    args = parser.parse_args(argv)
    if args.in_place:
        result = {"rows": None, **measure(args.database_url, repeat=args.repeat)}
    else:
        with scratch_database(args.database_url) as url:
            started = time.perf_counter()
            fill(url, terminal=args.rows)
            fill_seconds = time.perf_counter() - started
            result = {"rows": args.rows, "fill_seconds": round(fill_seconds, 1), **measure(url, repeat=args.repeat)}
    out = out or sys.stdout
    json.dump(result, out)
    out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
