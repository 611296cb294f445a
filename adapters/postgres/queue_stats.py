"""Reads :class:`worker.records.QueueStats` for the metrics collector, at scrape time.

Scrapes arrive on the HTTP server's threads, not on the worker's event loop, so the
reader keeps one synchronous connection of its own (never one of the store's pool),
reused across scrapes and reopened after any error (at once, for the same read, when the
server ended it between reads). Each read is one query in a
read-only transaction whose statement timeout bounds what a scrape can cost the
database: a slow or locked table costs one failed scrape, never a pile-up.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from evq.adapters.postgres.database import connect_kwargs, translated
from evq.adapters.postgres.queries import Q
from evq.worker.metrics import PENDING_AGE_BUCKETS
from evq.worker.records import QueueStats
from evq.worker.states import Status

# Oban Met's default: above this many rows a terminal status is estimated, not counted.
EXACT_LIMIT = 50_000


class QueueStatsReader:
    def __init__(self, url: str, *, timeout: float = 2.0, exact_limit: int = EXACT_LIMIT):
        self.url = url
        self.timeout = timeout
        self.exact_limit = exact_limit
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def read(
        self,
        buckets: Sequence[float],
        *,
        now: datetime | None = None,
        pending_buckets: Sequence[float] = PENDING_AGE_BUCKETS,
    ) -> QueueStats:
        """One bounded query; raises an EvqError (DatabaseUnavailable, ...) when it cannot.

        A kept connection the server ended since the last read (a restart, an idle timeout, a
        pooler's recycle) is reopened and the query asked once more: the database may well be
        answering now, and saying it cannot be read would be stale. Not after a query that
        failed on a live connection (a statement timeout): that costs this read alone."""
        params = {
            "now": now,
            "buckets": list(buckets),
            "pending_buckets": sorted(pending_buckets),
            "exact_limit": self.exact_limit,
        }
        with self._lock, translated(self.url):
            kept = self._conn is not None and not self._conn.closed
            try:
                row = self._query(params)
            except psycopg.OperationalError:
                ended = self._conn is not None and self._conn.broken
                self._drop()
                if not (kept and ended):
                    raise
                try:
                    row = self._query(params)
                except BaseException:
                    self._drop()
                    raise
            except BaseException:
                self._drop()
                raise
        assert row is not None
        return _stats(row, buckets, pending_buckets)

    def _query(self, params: dict[str, Any]) -> dict[str, Any] | None:
        conn = self._connection()
        with conn.transaction():
            conn.execute(Q["queue_stats_timeout"], {"timeout_ms": int(self.timeout * 1000)})
            return conn.execute(Q["queue_stats"], params).fetchone()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _connection(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            kwargs = {**connect_kwargs(), "application_name": "evq-metrics"}
            kwargs["connect_timeout"] = max(2, math.ceil(self.timeout))
            # The same query every scrape gains nothing from being prepared, and
            # PgBouncer in transaction mode cannot keep prepared statements.
            self._conn = psycopg.connect(self.url, row_factory=dict_row, prepare_threshold=None, **kwargs)
            self._conn.read_only = True
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _stats(row: dict[str, Any], buckets: Sequence[float], pending_buckets: Sequence[float]) -> QueueStats:
    # No buckets asked for (the overview shows no histogram): array_agg of no rows is NULL.
    return QueueStats(
        steps={str(s): int(row[str(s)]) for s in Status},
        unknown_oldest_age=float(row["unknown_oldest_age"]),
        unknown_age_sum=float(row["unknown_age_sum"]),
        unknown_buckets=tuple(
            zip((float(b) for b in sorted(buckets)), (int(n) for n in row["unknown_buckets"] or ()), strict=True)
        ),
        pending_oldest_age=float(row["pending_oldest_age"]),
        in_flight_expired=int(row["in_flight_expired"]),
        estimated=tuple(row["estimated"]),
        circuits=dict(row.get("circuits") or {}),
        pending_due=int(row["pending_due"]),
        pending_age_sum=float(row["pending_age_sum"]),
        pending_buckets=tuple(
            zip(
                (float(b) for b in sorted(pending_buckets)), (int(n) for n in row["pending_buckets"] or ()), strict=True
            )
        ),
        refusals={(str(i), str(f)): int(n) for i, f, n in row["refusals"]},
        held_oldest_age=float(row["held_oldest_age"]),
        evidence_partitions_ahead=int(row["evidence_partitions_ahead"]),
        evidence_overflow_rows=int(row["evidence_overflow_rows"] or 0),
    )
