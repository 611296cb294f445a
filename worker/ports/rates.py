"""The shared per-provider token buckets and 429 pauses (worker/ratelimit.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from evq.worker.records import Grant


class RateStore(Protocol):
    async def rate_take(
        self, *, provider: str, per_second: float, burst: int, want: int, now: datetime | None = None
    ) -> Grant: ...

    async def rate_refund(self, *, provider: str, burst: int, tokens: int, now: datetime | None = None) -> None: ...

    async def rate_pause(self, *, provider: str, seconds: float, now: datetime | None = None) -> float:
        """Pause the provider for at least ``seconds``; the seconds its pause now lasts."""
        ...
