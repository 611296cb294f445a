"""Content retention (worker/content_retention.py): a closed step's body removed, its proof kept."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from evq.worker.records import RedactCounts


class RedactStore(Protocol):
    async def redact_content(self, *, keep: timedelta, limit: int, actor: str) -> RedactCounts:
        """Redact up to ``limit`` closed steps closed more than ``keep`` ago by the store's clock:
        text and html replaced by their sizes and SHA-256, everything else kept, a
        ``content_redacted`` evidence row each, in one transaction. Never an open step,
        never one twice; ``RedactCounts.batches`` is 1."""
        ...
