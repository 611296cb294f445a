"""Worker heartbeats (table worker_heartbeats): the trace `evq admin health` reads."""

from __future__ import annotations

from collections.abc import Sequence

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase


class PostgresHeartbeats(PostgresBase):
    """A running worker's row, refreshed every few seconds and deleted when it stops."""

    async def heartbeat(self, owner: str, providers: Sequence[str]) -> None:
        await self._fetch("heartbeat_beat", Q["heartbeat_beat"], {"owner": owner, "providers": list(providers)})

    async def heartbeat_end(self, owner: str) -> None:
        await self._fetch("heartbeat_end", Q["heartbeat_end"], {"owner": owner})
