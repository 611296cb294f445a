"""The ceiling mode: what one connection does with the least a queue must do: claim 100 rows
with SKIP LOCKED and finish them with one batched UPDATE (the most any queue on this PostgreSQL
can do), and with one commit per row. Every drain figure is also printed as a ratio to it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import psycopg

from bench.config import Figure
from evq.worker.errors import EvqError

if TYPE_CHECKING:
    from bench.harness import Bench


def mode_ceiling(bench: Bench) -> None:
    c = bench.config
    for per_row, label, n in (
        (False, "raw SQL ceiling: claim 100 SKIP LOCKED + one batched UPDATE", c.steps),
        (True, "raw SQL, claim 100 + one commit per row", max(1000, c.steps // 4)),
    ):

        def once(n: int = n, per_row: bool = per_row) -> tuple[float, None]:
            name = bench.db.create()
            try:
                return raw_sql_drain(bench.db.url(name), n, per_row=per_row), None
            finally:
                bench.db.drop(name)

        values, _ = bench.repeat(once)
        bench.add(Figure("ceiling", label, "rows/s", values, note=f"{n} rows, one connection"))


RAW_SETUP = """
CREATE TABLE bench_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload bytea,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz
);
CREATE INDEX bench_jobs_queued ON bench_jobs (id) WHERE status = 'queued';
"""
RAW_CLAIM = """
WITH picked AS (
    SELECT id FROM bench_jobs WHERE status = 'queued' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED
)
UPDATE bench_jobs j SET status = 'picked', updated_at = now() FROM picked WHERE j.id = picked.id
RETURNING j.id, j.payload
"""


def raw_sql_drain(url: str, n: int, *, per_row: bool) -> float:
    """The ceiling: what one connection does with the least a queue must do."""
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in RAW_SETUP.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("INSERT INTO bench_jobs (payload) SELECT ''::bytea FROM generate_series(1, %s)", (n,))
        conn.execute("ANALYZE bench_jobs")
        started = time.perf_counter()
        done = 0
        while True:
            ids = [r[0] for r in conn.execute(RAW_CLAIM).fetchall()]
            if not ids:
                break
            if per_row:
                for i in ids:
                    conn.execute("UPDATE bench_jobs SET status = 'done', updated_at = now() WHERE id = %s", (i,))
            else:
                conn.execute("UPDATE bench_jobs SET status = 'done', updated_at = now() WHERE id = ANY(%s)", (ids,))
            done += len(ids)
        elapsed = time.perf_counter() - started
    if done != n:
        raise EvqError(f"raw SQL drain did {done} of {n}")
    return n / elapsed
