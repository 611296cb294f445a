"""The pruner: retention, the only path that removes evidence (evq prune).

Terminal steps (accepted, rejected) created and closed before a cutoff are
deleted with their evidence and decisions, a batch at a time, each batch in its
own transaction together with the prune_log row that records it: an interrupted
prune (Ctrl-C, a lost connection) leaves every finished batch done and logged
and the rest untouched. Rows that are not terminal (in flight, retryable,
unknown) are never touched, however old. The database enforces the same: the
append-only trigger refuses any DELETE of evidence outside a prune transaction,
and inside one refuses evidence of a step that is not terminal.

Prune is a write command for administrators; it shares the service shape
(config with validation, ``run_once`` returning counts) so it can also run
periodically.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

from worker.errors import ConfigError


@dataclass(frozen=True, slots=True)
class PruneCounts:
    steps: int = 0
    evidence: int = 0
    decisions: int = 0
    batches: int = 0

    @property
    def total(self) -> int:
        return self.steps + self.evidence + self.decisions

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            self.steps + other.steps,
            self.evidence + other.evidence,
            self.decisions + other.decisions,
            self.batches + other.batches,
        )


class PruneStore(Protocol):
    async def prune_batch(
        self, *, cutoff: datetime, limit: int, actor: str, run: uuid.UUID, batch: int, now: datetime | None = None
    ) -> PruneCounts: ...

    async def prune_count(self, *, cutoff: datetime) -> PruneCounts: ...


@dataclass(frozen=True, slots=True)
class PrunerConfig:
    older_than: timedelta = timedelta(days=90)
    batch: int = 1000
    dry_run: bool = False
    # How often the service runs when it runs periodically.
    interval: float = 3600.0

    def validate(self) -> PrunerConfig:
        if self.older_than <= timedelta(0):
            raise ConfigError("--older-than must be a positive duration, e.g. 90d")
        if not 1 <= self.batch <= 100_000:
            raise ConfigError("--batch-size must be between 1 and 100000")
        if self.interval <= 0:
            raise ConfigError("the prune interval must be positive")
        return self


class Pruner:
    name = "pruner"

    def __init__(
        self,
        store: PruneStore,
        config: PrunerConfig,
        *,
        actor: str,
        progress: Callable[[PruneCounts], None] = lambda _: None,
    ):
        self.store = store
        self.config = config.validate()
        self.interval = config.interval
        self.actor = actor
        self.progress = progress

    def cutoff(self, now: datetime | None = None) -> datetime:
        return (now or datetime.now(timezone.utc)) - self.config.older_than

    async def run_once(self, now: datetime | None = None) -> PruneCounts:
        """Prune until nothing older than the cutoff is left (or count it, dry run)."""
        cutoff = self.cutoff(now)
        if self.config.dry_run:
            return await self.store.prune_count(cutoff=cutoff)
        run = uuid.uuid4()
        total = PruneCounts()
        while True:
            counts = await self.store.prune_batch(
                cutoff=cutoff, limit=self.config.batch, actor=self.actor, run=run, batch=total.batches + 1, now=now
            )
            if counts.steps == 0:
                return total
            total = total + counts
            self.progress(total)
