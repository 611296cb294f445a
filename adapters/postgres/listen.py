"""LISTEN/NOTIFY wakeups for the claim loop, with polling as the fallback.

Enqueue notifies channel ``evq_steps`` in its own statement; the notification is
delivered at commit. A dedicated connection listens. Behind PgBouncer in
transaction mode LISTEN is accepted but notifications never arrive, so before
relying on it we send ourselves a probe; if it does not come back, we say so and
poll (EVQ_LISTEN=auto), or refuse to start (EVQ_LISTEN=on).
"""

from __future__ import annotations

import asyncio
import secrets

import psycopg

from evq.adapters.postgres.database import connect_kwargs
from evq.worker.backoff import reconnect_delay
from evq.worker.errors import ConfigError
from evq.worker.logs import get_logger

log = get_logger("evq.listen")
CHANNEL = "evq_steps"


class PostgresWakeup:
    def __init__(self, url: str):
        self.url = url
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._probe_channel = f"evq_probe_{secrets.token_hex(4)}"
        self._probe = asyncio.Event()

    @classmethod
    async def start(cls, url: str, *, mode: str = "auto", probe_timeout: float = 2.0):
        """A listening wakeup, or None when notifications do not arrive (caller polls)."""
        wakeup = cls(url)
        wakeup._task = asyncio.create_task(wakeup._listen(), name="evq-listen")
        if await wakeup._probe_roundtrip(probe_timeout):
            log.info("listen_ready", channel=CHANNEL)
            return wakeup
        await wakeup.close()
        if mode == "on":
            raise ConfigError(
                "EVQ_LISTEN=on but notifications do not arrive (PgBouncer in transaction mode?)",
                hint="use EVQ_LISTEN=auto or off to poll instead",
                field="EVQ_LISTEN",
            )
        log.warning(
            "listen_unavailable",
            note="LISTEN/NOTIFY does not work through this connection (PgBouncer transaction pooling?); "
            "polling every second instead",
        )
        return None

    async def _probe_roundtrip(self, timeout: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, **connect_kwargs()) as c:
                    await c.execute("SELECT pg_notify(%s, 'probe')", (self._probe_channel,))
                await asyncio.wait_for(self._probe.wait(), timeout=0.5)
                return True
            except (TimeoutError, psycopg.Error):
                await asyncio.sleep(0.1)
        return False

    async def _listen(self) -> None:
        failures = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, **connect_kwargs()) as conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    await conn.execute(f"LISTEN {self._probe_channel}")
                    failures = 0
                    # Work may have arrived while we were not listening.
                    self._event.set()
                    async for note in conn.notifies():
                        if note.channel == self._probe_channel:
                            self._probe.set()
                        else:
                            self._event.set()
            except asyncio.CancelledError:
                raise
            except psycopg.Error as exc:
                failures += 1
                delay = reconnect_delay(failures)
                log.warning("listen_reconnect", error=type(exc).__name__, retry_in=round(delay, 2))
                self._event.set()  # polling covers the gap
                await asyncio.sleep(delay)

    async def wait(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout=timeout)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
