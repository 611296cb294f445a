"""Each API key's event feed (table key_events): what became of the sends it enqueued."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class EventFeed(Protocol):
    async def key_events(
        self,
        *,
        since: int,
        limit: int,
        offset: int = 0,
        key_id: str | None = None,
        key_name: str | None = None,
        every: bool = False,
    ) -> tuple[list[Mapping[str, Any]], int]:
        """Events after cursor ``since`` (an event id), oldest first, ``offset`` of them skipped,
        at most ``limit``: of the key with id ``key_id`` (or named ``key_name``), or of every key
        (and of steps enqueued without one) with ``every``; and how many there are after the
        cursor, counted up to COUNT_CAP + 1 (a figure above COUNT_CAP: more), of the same
        snapshot as the page. Each row: id, key_id, key_name, kind (rejected, unknown, verdict),
        step, run_id, step_id, status, reason, detail, actor, evidence_id, created_at."""
        ...
