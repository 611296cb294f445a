"""Retention (worker/pruner.py): the only path that removes evidence."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Protocol

from evq.worker.records import BudgetKey, BudgetPrune, PartitionPrune, PruneCounts


class PruneStore(Protocol):
    async def prune_cutoff(self, *, older_than: timedelta) -> datetime:
        """Now less ``older_than`` by the database's clock: the client's never decides what is old."""
        ...

    async def prune_batch(
        self, *, cutoff: datetime, limit: int, actor: str, run: uuid.UUID, batch: int
    ) -> PruneCounts: ...

    async def prune_count(self, *, cutoff: datetime) -> PruneCounts: ...

    async def prune_partition(
        self, *, cutoff: datetime, actor: str, run: uuid.UUID, batch: int, after: int | None
    ) -> PartitionPrune | None:
        """Seal the oldest evidence partition starting above step id ``after`` whose steps all
        look closed before ``cutoff``, then drop it if they all are (logged as prune batch
        ``batch``); None when no partition is left to try (a store without partitions has none).
        The steps and decisions of a dropped partition are left for ``prune_batch``."""
        ...

    async def evidence_partitions_ahead(self, steps: int) -> int:
        """Create evidence partitions of ``steps`` step ids until four lie beyond the newest
        step; how many were made (0 for a store without partitions)."""
        ...

    async def prune_refusals(self, *, cutoff: datetime, limit: int, dry_run: bool = False) -> int:
        """Delete at most ``limit`` refused enqueues recorded before ``cutoff`` (``dry_run``: count
        every one, delete none); how many. The counts behind the metric are kept."""
        ...

    async def prune_budgets(
        self, *, cutoff: datetime, limit: int, after: BudgetKey | None, dry_run: bool = False
    ) -> BudgetPrune:
        """Read the next ``limit`` blast-radius counters in key order after ``after`` (None: from
        the first) and delete those whose window closed before ``cutoff`` (``dry_run``: count
        them, delete none): an hour's or a day's window once over, a run's once the run has no
        step left and nothing charged it since the cutoff; a budget it does not know is kept."""
        ...
