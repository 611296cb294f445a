"""Refused enqueues (worker/refusals.py): recorded by the interfaces, read by operators."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from evq.worker.refusals import Refusal


class RefusalStore(Protocol):
    async def record_refusal(self, refusal: Refusal, *, now: datetime | None = None) -> int:
        """Store one refusal and count it (enqueue_refusal_counts) in one short transaction; its id."""
        ...

    async def list_refusals(
        self,
        *,
        key_name: str | None = None,
        interface: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        """Refusals newest first, ``offset`` of them skipped, each as stored (worker/refusals.py);
        and how many match, counted up to COUNT_CAP + 1, of the same snapshot as the page."""
        ...
