"""Provider rate limits shared by every worker (worker/ratelimit.py): token buckets and 429 pauses."""

from __future__ import annotations

from datetime import datetime

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase
from evq.worker.records import Grant


class PostgresRates(PostgresBase):
    """The rate limiter's buckets."""

    async def rate_take(
        self, *, provider: str, per_second: float, burst: int, want: int, now: datetime | None = None
    ) -> Grant:
        params = {"provider": provider, "per_second": per_second, "burst": burst, "want": want, "now": now}
        rows = await self._fetch("rate_take", Q["rate_limit_take"], params)
        if not rows:
            # First use of this provider's bucket; every later take is the one statement above.
            await self._fetch("rate_seed", Q["rate_limit_seed"], params)
            rows = await self._fetch("rate_take", Q["rate_limit_take"], params)
        row = rows[0]
        return Grant(granted=row["granted"], paused_for=row["paused_for"], next_token_in=row["next_token_in"])

    async def rate_refund(self, *, provider: str, burst: int, tokens: int, now: datetime | None = None) -> None:
        await self._fetch(
            "rate_refund", Q["rate_limit_refund"], {"provider": provider, "burst": burst, "tokens": tokens}
        )

    async def rate_pause(self, *, provider: str, seconds: float, now: datetime | None = None) -> float:
        rows = await self._fetch(
            "rate_pause", Q["rate_limit_pause"], {"provider": provider, "seconds": seconds, "now": now}
        )
        return float(rows[0]["paused_for"])
