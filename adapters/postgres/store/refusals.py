"""Refused enqueues (worker/refusals.py): recorded with their counter, listed, pruned."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase
from evq.worker.refusals import Refusal


def refusal_params(refusal: Refusal, now: datetime | None = None) -> dict[str, Any]:
    """refusal_record's parameters (the store's and evq.enqueue_own's)."""
    params: dict[str, Any] = {**asdict(refusal), "now": now}
    params["errors"] = json.dumps(refusal.errors, ensure_ascii=False)
    params["asked"] = json.dumps(refusal.asked, ensure_ascii=False)
    return params


class PostgresRefusals(PostgresBase):
    """The enqueue_refusals rows and the enqueue_refusal_counts behind the metric."""

    async def record_refusal(self, refusal: Refusal, *, now: datetime | None = None) -> int:
        # One statement on an autocommit connection: its own short transaction, whatever
        # the caller does next (the refusal stands even though nothing else was written).
        rows = await self._fetch("record_refusal", Q["refusal_record"], refusal_params(refusal, now))
        return int(rows[0]["id"])

    async def list_refusals(
        self,
        *,
        key_name: str | None = None,
        interface: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        params = {"key_name": key_name, "interface": interface, "before_id": before_id}
        return await self._page(
            "list_refusals", Q["refusal_list"], Q["refusal_count"], {**params, "limit": limit, "offset": offset}
        )

    async def prune_refusals(self, *, cutoff: datetime, limit: int, dry_run: bool = False) -> int:
        if dry_run:
            rows = await self._fetch("prune_refusals_count", Q["refusals_prune_count"], {"cutoff": cutoff})
        else:
            rows = await self._fetch("prune_refusals", Q["refusals_prune"], {"cutoff": cutoff, "limit": limit})
        return int(rows[0]["refusals"])
