"""Content retention (worker/content_retention.py): closed steps' bodies removed through evq_redact_batch."""

from __future__ import annotations

from datetime import timedelta

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase
from evq.worker.records import RedactCounts


class PostgresRedact(PostgresBase):
    """One batch per call, one statement, its own transaction: a crash loses no finished batch."""

    async def redact_content(self, *, keep: timedelta, limit: int, actor: str) -> RedactCounts:
        rows = await self._fetch("redact", Q["steps_redact"], {"keep": keep, "limit": limit, "actor": actor})
        return RedactCounts(redacted=rows[0]["redacted"], batches=1)
