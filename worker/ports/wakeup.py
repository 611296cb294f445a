"""How the claim loop learns that work may have arrived (adapters/postgres/listen.py: LISTEN/NOTIFY)."""

from __future__ import annotations

from typing import Protocol


class Wakeup(Protocol):
    """Tells the claim loop that work may have arrived; polling is the fallback."""

    async def wait(self, timeout: float) -> bool:
        """True when woken before ``timeout`` seconds passed."""
        ...

    async def close(self) -> None: ...
