"""Retention (`evq prune`, an administrator's write): the cutoff, the batches, the count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg import errors as pgerr

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase
from evq.worker.approval_policy import WINDOW_SECONDS
from evq.worker.errors import DatabaseUnavailable
from evq.worker.records import BudgetKey, BudgetPrune, PartitionPrune, PruneCounts


class PostgresPrune(PostgresBase):
    """Deleting terminal steps closed before a cutoff, with their evidence and decisions:
    whole evidence partitions first (``prune_partition``), then batches of rows."""

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

    async def prune_partition(
        self, *, cutoff: datetime, actor: str, run: Any, batch: int, after: int | None
    ) -> PartitionPrune | None:
        """Seal, then drop: two transactions (migrations/baseline/partitions.sql). Sealed and committed, the
        partition refuses every new row, so the drop's check of its steps cannot be overtaken
        by a step changing under it."""
        sealed = await self._fetch("prune_seal", Q["evidence_seal"], {"cutoff": cutoff, "after": after})
        if not sealed:
            return None
        name, lo, hi = sealed[0]["name"], sealed[0]["lo"], sealed[0]["hi"]
        try:
            rows = await self._fetch(
                "prune_drop",
                Q["evidence_drop"],
                {"name": name, "cutoff": cutoff, "actor": actor, "run": run, "batch": batch},
            )
        except DatabaseUnavailable as exc:
            if not isinstance(exc.__cause__, pgerr.LockNotAvailable):
                # Anything else (a lost connection, a cancel) leaves the seal: the next
                # evq prune takes this partition first. Refusing new history for steps
                # closed before the cutoff is the safe side of not knowing.
                raise
            # Readers kept evidence busy past the drop's lock timeout: give the partition
            # back (its rows still go by the batches) and let a later run try again.
            # The unseal waits for the partition's lock a moment only; a partition left sealed
            # is the next run's first.
            await self._fetch("prune_unseal", Q["evidence_unseal"], {"name": name})
            return PartitionPrune(name=name, lo=lo, hi=hi, dropped=False, busy=True)
        row = rows[0]
        return PartitionPrune(name=name, lo=lo, hi=hi, dropped=row["dropped"], evidence=row["evidence"])

    async def evidence_partitions_ahead(self, steps: int) -> int:
        rows = await self._fetch("evidence_partitions_ahead", Q["evidence_partitions_ahead"], {"steps": steps})
        return int(rows[0]["made"])

    async def prune_budgets(
        self, *, cutoff: datetime, limit: int, after: BudgetKey | None, dry_run: bool = False
    ) -> BudgetPrune:
        budget, scope, window = after or _FIRST_BUDGET
        rows = await self._fetch(
            "prune_budgets",
            Q["budgets_prune"],
            {
                "cutoff": cutoff,
                "limit": limit,
                "dry": dry_run,
                "after_budget": budget,
                "after_scope": scope,
                "after_window": window,
                "windowed": [str(b) for b in WINDOW_SECONDS],
                "seconds": list(WINDOW_SECONDS.values()),
            },
        )
        row = rows[0]
        last = None if row["last_budget"] is None else (row["last_budget"], row["last_scope"], row["last_window"])
        return BudgetPrune(budgets=int(row["budgets"]), last=last)


# Below every counter's key: no budget name is empty.
_FIRST_BUDGET: BudgetKey = ("", "", datetime.min.replace(tzinfo=UTC))
