"""The one shape every background service shares (River's maintenance services):
a config with named defaults and validation, ``run_once()`` returning counts (what
tests call), and a loop that runs it every ``interval`` until told to stop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from evq.worker.backoff import jitter
from evq.worker.errors import DatabaseUnavailable
from evq.worker.logs import get_logger
from evq.worker.ports import Service

log = get_logger("evq.service")


async def run_periodically(service: Service, stop: asyncio.Event, *, delay_first: bool = False) -> None:
    """Run ``service.run_once`` every interval (jittered so many workers spread out)."""
    if delay_first and await _stopped_within(stop, jitter(service.interval)):
        return
    while not stop.is_set():
        try:
            result = await service.run_once()
            if getattr(result, "total", 0):
                log.info(f"{service.name}_pass", service=service.name, **_fields(result))
        except DatabaseUnavailable as exc:
            log.warning(f"{service.name}_db_unavailable", service=service.name, error=exc.message)
        except Exception:
            # A bug in one pass must not kill the worker; the next pass tries again.
            log.exception(f"{service.name}_failed", service=service.name)
        await _stopped_within(stop, jitter(service.interval))


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        return False
    return True


def _fields(result: Any) -> dict[str, Any]:
    slots = getattr(result, "__slots__", ())
    return {name: getattr(result, name) for name in slots}
