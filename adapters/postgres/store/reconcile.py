"""The reconciler's reads and writes over unknown rows (worker/reconciler.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase, json_text
from evq.worker import metrics
from evq.worker.records import (
    UnknownStep,
)


class PostgresReconcile(PostgresBase):
    """Unknown rows looked up at their provider."""

    async def reconcile_claim(
        self, *, providers: Sequence[str], max_checks: int, hold_seconds: float, now: datetime | None = None
    ) -> UnknownStep | None:
        rows = await self._fetch(
            "reconcile_claim",
            Q["step_reconcile_claim"],
            {
                "now": now,
                "providers": list(providers),
                "max_checks": max_checks,
                "hold_seconds": hold_seconds,
                "limit": 1,
            },
        )
        return UnknownStep.from_row(rows[0]) if rows else None

    async def reconcile_found(
        self,
        step_id: int,
        *,
        provider_message_id: str | None,
        message: str,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool:
        rows = await self._fetch(
            "reconcile_found",
            Q["step_reconcile_found"],
            {
                "now": now,
                "id": step_id,
                "provider_message_id": provider_message_id,
                "message": message,
                "detail": json_text(detail),
                "actor": actor,
            },
        )
        for row in rows:
            metrics.observe_closed(row["created_at"], row["closed_at"])
        return bool(rows)

    async def reconcile_absent(
        self,
        step_id: int,
        *,
        next_check: float,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool:
        rows = await self._fetch(
            "reconcile_absent",
            Q["step_reconcile_absent"],
            {"now": now, "id": step_id, "next_check": next_check, "detail": json_text(detail), "actor": actor},
        )
        return bool(rows[0]["n"])
