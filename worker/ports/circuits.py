"""Provider circuits (worker/circuit.py) as the store keeps them; each change writes its event row with it."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol


class CircuitReader(Protocol):
    async def circuits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        """Every provider circuit there is a row for (state, reason, probe schedule), as of ``now``."""
        ...


class CircuitStore(CircuitReader, Protocol):
    """The worker's changes: trip, close, and the probe that tests an open circuit."""

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
    ) -> dict[str, Any] | None: ...

    async def circuit_close(
        self, *, provider: str, reason: str, detail: str, actor: str, now: datetime | None = None
    ) -> bool: ...

    async def circuit_probe_take(
        self, *, provider: str, owner: str, hold_seconds: float, lease_seconds: float, now: datetime | None = None
    ) -> bool: ...

    async def circuit_probe_idle(
        self, *, provider: str, owner: str, probe_base: float, detail: str = ..., now: datetime | None = None
    ) -> bool: ...
