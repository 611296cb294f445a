"""The callback deliveries a worker makes (worker/callbacks.py): the rows, and the POST."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol


class CallbackStore(Protocol):
    async def callback_claim(
        self, *, limit: int, hold_seconds: float, now: datetime | None = None
    ) -> list[Mapping[str, Any]]:
        """Due deliveries, each held for ``hold_seconds``: id, attempts, url, key_name,
        callback_generation, pepper and the event's fields (event_id, kind, step, ...)."""
        ...

    async def callback_delivered(self, delivery_id: int, *, status_code: int, now: datetime | None = None) -> None: ...

    async def callback_failed(
        self,
        delivery_id: int,
        *,
        error: str,
        status_code: int | None,
        delay: float,
        give_up: bool,
        now: datetime | None = None,
    ) -> None: ...


class Poster(Protocol):
    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        """POST ``body`` to ``url``; the response's status code. Raises CallbackRefused
        (worker/callbacks.py) for a URL it will not call, OSError/TimeoutError otherwise."""
        ...
