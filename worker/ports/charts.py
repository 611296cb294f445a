"""The overview's pictures (issue 18): the queue sampler's write and the windowed reads the
charts draw from (ops/web/charts.py). Each read covers the last ``hours`` (a key of
:data:`evq.worker.window.WINDOWS`) up to ``now``."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol


class SampleStore(Protocol):
    async def sample_queue(self, sampled_by: str, *, keep_seconds: float, now: datetime | None = None) -> bool:
        """Write this minute's queue figures unless some process already did (the first writer
        wins), and delete samples older than ``keep_seconds``; whether this call wrote the row."""
        ...

    async def roll_up_sends(self, *, keep_seconds: float, now: datetime | None = None) -> int:
        """Roll up the sends of every complete minute (ended at least 2 minutes before ``now``)
        not rolled up yet, at most 24 h back, unless another process is doing it; delete rollups
        older than ``keep_seconds``. How many minutes this call rolled up (0 when it skipped)."""
        ...


class ChartReader(Protocol):
    async def chart_sends(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Rows ``at`` (a bucket's start), ``outcome`` (accepted, rejected, retryable, unknown:
        provider_response rows; no_answer: lease_expired to unknown) and ``n``, oldest first."""
        ...

    async def chart_unknown_ages(self, *, now: datetime | None = None) -> list[int]:
        """How many rows are unknown now in each bucket of :data:`evq.worker.window.UNKNOWN_AGES`."""
        ...

    async def chart_queue_samples(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """The queue_samples rows of the window, oldest first (a minute nobody sampled has none)."""
        ...

    async def chart_providers(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Per provider with evidence in the window: attempts, accepted, rejected, retryable,
        unknown, no_answer, p50_ms and p95_ms (None without answers)."""
        ...
