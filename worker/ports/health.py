"""What the health gate (ops/app/health.py) reads: its own short reads, so it answers when
no store could open (adapters/postgres/health.py)."""

from __future__ import annotations

from typing import Any, Protocol

from evq.worker.errors import EvqError


class HealthReader(Protocol):
    async def schema_revision(self) -> tuple[str | None, str]:
        """(the database's revision, the one this evq needs); raises DatabaseUnavailable when it cannot."""
        ...

    async def isolation(self) -> EvqError | None:
        """Why evq may not run on this database as it is configured (its transactions do not
        start READ COMMITTED), or None."""
        ...

    async def workers_seen(self, within: float) -> list[dict[str, Any]]:
        """The heartbeats of the last ``within`` seconds: owner, seen_at, age_seconds."""
        ...

    async def collector(self) -> float:
        """Seconds the queue gauges' query took; raises an EvqError when it fails."""
        ...

    async def circuits(self) -> list[dict[str, Any]]: ...

    async def providers_waiting(self) -> list[str]:
        """The providers that steps wait for now (pending, or retryable and due)."""
        ...
