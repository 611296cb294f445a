"""What worker/service.py runs periodically: the rescuer, the reconciler, the pruner."""

from __future__ import annotations

from typing import Any, Protocol


class Service(Protocol):
    """The one shape every background service shares (River's maintenance services): a name,
    an interval, and ``run_once()`` returning counts (what tests call)."""

    name: str
    interval: float

    async def run_once(self) -> Any: ...
