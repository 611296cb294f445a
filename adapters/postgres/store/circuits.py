"""Provider circuits (worker/circuit.py): opened, probed and closed in the database every worker reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase


class PostgresCircuits(PostgresBase):
    """The circuit breaker's rows."""

    async def circuit_trip(
        self,
        *,
        provider: str,
        reason: str,
        detail: str,
        actor: str,
        probe_base: float,
        probe_max: float,
        now: datetime | None = None,
    ) -> dict[str, Any] | None:
        """Open the circuit (or reopen it after a failed probe); the change, or None if it was open."""
        params = {
            "provider": provider,
            "reason": reason,
            "detail": detail,
            "actor": actor,
            "probe_base": probe_base,
            "probe_max": probe_max,
            "now": now,
        }
        row = (await self._fetch("circuit_trip", Q["circuit_trip"], params))[0]
        if not row["present"]:
            await self._fetch("circuit_seed", Q["circuit_seed"], params)
            row = (await self._fetch("circuit_trip", Q["circuit_trip"], params))[0]
        return row if row["from_state"] is not None else None

    async def circuit_close(
        self, *, provider: str, reason: str, detail: str, actor: str, now: datetime | None = None
    ) -> bool:
        rows = await self._fetch(
            "circuit_close",
            Q["circuit_close"],
            {"provider": provider, "reason": reason, "detail": detail, "actor": actor, "now": now},
        )
        return bool(rows)

    async def circuit_probe_take(
        self, *, provider: str, owner: str, hold_seconds: float, lease_seconds: float, now: datetime | None = None
    ) -> bool:
        rows = await self._fetch(
            "circuit_probe_take",
            Q["circuit_probe_take"],
            {
                "provider": provider,
                "owner": owner,
                "hold_seconds": hold_seconds,
                "lease_seconds": lease_seconds,
                "now": now,
            },
        )
        return bool(rows)

    async def circuit_probe_idle(
        self,
        *,
        provider: str,
        owner: str,
        probe_base: float,
        detail: str = "the probe found no step to send",
        now: datetime | None = None,
    ) -> bool:
        rows = await self._fetch(
            "circuit_probe_idle",
            Q["circuit_probe_idle"],
            {"provider": provider, "owner": owner, "probe_base": probe_base, "detail": detail, "now": now},
        )
        return bool(rows)

    async def circuits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._fetch("circuits", Q["circuit_list"], {"now": now})
