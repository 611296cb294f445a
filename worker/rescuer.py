"""The rescuer: rows left in flight past their lease become unknown (invariant 4).

A worker that died or stalled may have handed the request to the provider, so the
row is never silently made retryable; only a provider that dedupes our key, with
its window still open for a whole further lease, lets the row retry. Every worker
runs a rescuer; the statement's SKIP LOCKED keeps them from doing a row twice.
It also closes the dedupe window: retryable rows that may have been delivered,
whose provider no longer dedupes for a whole lease, become unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from evq.worker import metrics
from evq.worker.errors import ConfigError
from evq.worker.ports import RescueStore
from evq.worker.records import RescueCounts


@dataclass(frozen=True, slots=True)
class RescuerConfig:
    interval: float = 15.0
    batch: int = 1000
    lease_seconds: float = 120.0
    default_max_attempts: int = 5

    def validate(self) -> RescuerConfig:
        if self.interval <= 0 or self.batch < 1 or self.lease_seconds <= 0 or self.default_max_attempts < 1:
            raise ConfigError(f"invalid rescuer config: {self}")
        return self


class Rescuer:
    name = "rescuer"

    def __init__(self, store: RescueStore, config: RescuerConfig, *, actor: str = "rescuer"):
        self.store = store
        self.config = config.validate()
        self.interval = config.interval
        self.actor = actor

    async def run_once(self, now: datetime | None = None) -> RescueCounts:
        total = RescueCounts()
        while True:
            counts = await self.store.rescue(
                limit=self.config.batch,
                lease_seconds=self.config.lease_seconds,
                default_max_attempts=self.config.default_max_attempts,
                actor=self.actor,
                now=now,
            )
            total = RescueCounts(
                unknown=total.unknown + counts.unknown,
                retryable=total.retryable + counts.retryable,
                window_closed=total.window_closed + counts.window_closed,
            )
            metrics.RESCUED.labels(to="unknown").inc(counts.unknown + counts.window_closed)
            metrics.RESCUED.labels(to="retryable").inc(counts.retryable)
            if counts.total < self.config.batch:
                return total
