"""The reconciler's statements (worker/reconciler.py): unknown rows settled by asking the provider."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from evq.worker.records import UnknownStep


class ReconcileStore(Protocol):
    async def reconcile_claim(
        self, *, providers: Sequence[str], max_checks: int, hold_seconds: float, now: datetime | None = None
    ) -> UnknownStep | None: ...

    async def reconcile_found(
        self,
        step_id: int,
        *,
        provider_message_id: str | None,
        message: str,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool: ...

    async def reconcile_absent(
        self, step_id: int, *, next_check: float, detail: Mapping[str, Any], actor: str, now: datetime | None = None
    ) -> bool: ...
