"""The overview's pictures (issue 18): the queue sampler's minute and the windowed chart reads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.queue_stats import EXACT_LIMIT
from evq.adapters.postgres.store.base import PostgresBase, fetch_all
from evq.worker.window import UNKNOWN_AGES, bounds, bucket_seconds

# A chart read longer than this fails (statement_timeout) rather than hold the overview.
CHART_TIMEOUT_MS = 5000
# The rollup runs in the background; its first run reads up to 24 h of evidence at once.
ROLLUP_TIMEOUT_MS = 60000


def _now(now: datetime | None) -> datetime:
    return now if now is not None else datetime.now(UTC)


class PostgresCharts(PostgresBase):
    async def _chart(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """One chart read in a read-only transaction with the reads' own settings (chart_settings)."""
        return await self._tuned_read(name, Q["chart_settings"], Q[name], params, {"timeout_ms": CHART_TIMEOUT_MS})

    async def sample_queue(self, sampled_by: str, *, keep_seconds: float, now: datetime | None = None) -> bool:
        rows = await self._fetch(
            "queue_sample",
            Q["queue_sample"],
            {
                "now": now,
                "sampled_by": sampled_by,
                "keep_seconds": keep_seconds,
                # The collector's histogram buckets are not part of a sample.
                "buckets": [],
                "pending_buckets": [],
                "exact_limit": EXACT_LIMIT,
            },
        )
        return bool(rows[0]["written"])

    async def roll_up_sends(self, *, keep_seconds: float, now: datetime | None = None) -> int:
        async with self.transaction("send_rollup") as conn:
            [lock] = await fetch_all(conn, Q["send_rollup_lock"], {})
            if not lock["got"]:
                return 0
            # The charts' settings: without them JIT compiles the rollup (the planner cannot
            # see how few minutes it reads) for far longer than the statement runs.
            await conn.execute(Q["chart_settings"], {"timeout_ms": ROLLUP_TIMEOUT_MS})
            [row] = await fetch_all(conn, Q["send_rollup"], {"now": now, "keep_seconds": keep_seconds})
            return int(row["minutes"])

    async def chart_sends(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        since, until = bounds(hours, _now(now))
        params = {"since": since, "until": until, "bucket": bucket_seconds(hours)}
        return await self._chart("chart_sends", params)

    async def chart_unknown_ages(self, *, now: datetime | None = None) -> list[int]:
        rows = await self._fetch(
            "chart_unknown_ages", Q["chart_unknown_ages"], {"now": _now(now), "bounds": list(UNKNOWN_AGES)}
        )
        counts = [0] * (len(UNKNOWN_AGES) + 1)
        for row in rows:
            counts[int(row["bucket"])] += int(row["n"])
        return counts

    async def chart_queue_samples(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        since, until = bounds(hours, _now(now))
        return await self._chart("chart_queue_samples", {"since": since, "until": until})

    async def chart_providers(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        since, until = bounds(hours, _now(now))
        return await self._chart("chart_providers", {"since": since, "until": until})
