"""The peer "pgqueuer with evidence": what a user builds on pgqueuer to get evq's guarantee.

Its handler, for each job, commits an attempt row BEFORE the (no-op) send and an outcome row
AFTER it, each in its own transaction (one autocommit INSERT each, from a pool of 8 connections
per process, the size of an evq worker's pool), into a plain table the bench creates. It is
drained with the same jobs, processes and settings as the no-op pgqueuer peer (bench/peer.py);
the parent then checks that every job left both rows.
"""

from __future__ import annotations

from typing import Any

import psycopg

from evq.worker.errors import EvqError

POOL_SIZE = 8  # an evq worker's store pool (ops/wiring.py), so neither side has more connections

TABLE = """
CREATE TABLE bench_evidence (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    kind text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


def create_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLE)


def check(url: str, n: int) -> None:
    """Every job wrote its attempt and its outcome, once each."""
    with psycopg.connect(url) as conn:
        counts = dict(conn.execute("SELECT kind, count(DISTINCT job_id) FROM bench_evidence GROUP BY kind").fetchall())
        rows = conn.execute("SELECT count(*) FROM bench_evidence").fetchone()[0]
    if counts.get("attempt") != n or counts.get("outcome") != n or rows != 2 * n:
        raise EvqError(f"pgqueuer with evidence: {counts} rows for {n} jobs, expected an attempt and an outcome each")


class Writer:
    """The handler's side: one INSERT, its own transaction, per row."""

    def __init__(self, pool: Any, driver: str):
        self._pool = pool
        self._driver = driver

    @classmethod
    async def open(cls, url: str, driver: str) -> Writer:
        if driver == "asyncpg":
            import asyncpg

            info = psycopg.conninfo.conninfo_to_dict(url)
            keys = {"host": "host", "port": "port", "user": "user", "password": "password", "dbname": "database"}
            pool = await asyncpg.create_pool(
                min_size=POOL_SIZE, max_size=POOL_SIZE, **{keys[k]: v for k, v in info.items() if k in keys}
            )
            return cls(pool, driver)
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(url, min_size=POOL_SIZE, max_size=POOL_SIZE, kwargs={"autocommit": True}, open=False)
        await pool.open(wait=True)
        return cls(pool, driver)

    async def write(self, job_id: int, kind: str) -> None:
        if self._driver == "asyncpg":
            async with self._pool.acquire() as conn:
                await conn.execute("INSERT INTO bench_evidence (job_id, kind) VALUES ($1, $2)", job_id, kind)
        else:
            async with self._pool.connection() as conn:
                await conn.execute("INSERT INTO bench_evidence (job_id, kind) VALUES (%s, %s)", (job_id, kind))

    async def close(self) -> None:
        await self._pool.close()
