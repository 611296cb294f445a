"""What `evq admin health` reads from PostgreSQL (ops/app/health.py's HealthReader).

Its own short connections, never a store's pool: health must answer when the pool
cannot open (the database down), and a check must not wait behind the work it checks.
Every read is bounded (connect timeout, statement timeout) and raises an evq error
(DatabaseUnavailable, SchemaMismatch, ...) when it cannot answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from evq.adapters.postgres import isolation
from evq.adapters.postgres.database import head_revision, known_revision, translated
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.queue_stats import QueueStatsReader
from evq.worker.errors import EvqError

# A health check answers in seconds or says it could not.
TIMEOUT_SECONDS = 5


class PostgresHealth:
    def __init__(self, url: str):
        self.url = url

    async def schema_revision(self) -> tuple[str | None, str]:
        def read() -> tuple[str | None, str]:
            return known_revision(self.url), head_revision()

        return await asyncio.to_thread(read)

    async def isolation(self) -> EvqError | None:
        rows = await asyncio.to_thread(self._query, Q["isolation_default"], {})
        return isolation.refusal(rows[0])

    async def workers_seen(self, within: float) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._query, Q["heartbeats_seen"], {"within": within})

    async def circuits(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._query, Q["circuit_list"], {"now": None})

    async def providers_waiting(self) -> list[str]:
        rows = await asyncio.to_thread(self._query, Q["providers_waiting"], {})
        return [str(r["provider"]) for r in rows]

    async def collector(self) -> float:
        """The /metrics queue gauges' own query (adapters/postgres/queue_stats.py), timed."""

        def read() -> float:
            from evq.worker.metrics import UNKNOWN_AGE_BUCKETS

            reader = QueueStatsReader(self.url, timeout=TIMEOUT_SECONDS)
            try:
                started = time.perf_counter()
                reader.read(UNKNOWN_AGE_BUCKETS)
                return time.perf_counter() - started
            finally:
                reader.close()

        return await asyncio.to_thread(read)

    def _query(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with (
            translated(self.url),
            psycopg.connect(self.url, connect_timeout=TIMEOUT_SECONDS, application_name="evq-health") as conn,
        ):
            with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
                cur.execute(Q["queue_stats_timeout"], {"timeout_ms": TIMEOUT_SECONDS * 1000})
                cur.execute(query, params)
                return cur.fetchall()
