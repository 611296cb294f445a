"""Retention (`evq prune`, an administrator's write): the cutoff, the batches, the count."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase
from evq.worker.records import PruneCounts


class PostgresPrune(PostgresBase):
    """Deleting terminal steps closed before a cutoff, with their evidence and decisions."""

    async def prune_cutoff(self, *, older_than: timedelta) -> datetime:
        rows = await self._fetch("prune_cutoff", Q["prune_cutoff"], {"older_than": older_than})
        return rows[0]["cutoff"]

    async def prune_batch(self, *, cutoff: datetime, limit: int, actor: str, run: Any, batch: int) -> PruneCounts:
        """One batch in one transaction: the deletes, and the prune_log row that records them."""
        rows = await self._fetch(
            "prune", Q["steps_prune"], {"cutoff": cutoff, "limit": limit, "actor": actor, "run": run, "batch": batch}
        )
        row = rows[0]
        return PruneCounts(steps=row["steps"], evidence=row["evidence"], decisions=row["decisions"], batches=1)

    async def prune_count(self, *, cutoff: datetime) -> PruneCounts:
        rows = await self._fetch("prune_count", Q["steps_prune_count"], {"cutoff": cutoff})
        return PruneCounts(steps=rows[0]["steps"], evidence=rows[0]["evidence"], decisions=rows[0]["decisions"])
