"""Long work over many rows, each done independently: the contract's stop rules.

- The first Ctrl-C (or SIGTERM) lets the current row (or batch) finish, then stops:
  E_ABORTED (exit 7) with what was done so far. A second one exits 130 at once; the
  row in progress is one statement (a batch, one transaction), so it is either written
  whole or not at all. :func:`interruptible` is that rule for any loop (evq prune's
  batches); :func:`each` applies it to independent rows (bulk steps resolve).
- ``max_failures`` consecutive failures stop the work: E_MAX_FAILURES (exit 8).
- Progress goes to the log (stderr) every ``PROGRESS_ROWS`` rows or ``PROGRESS_SECONDS``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from evq.ops.app.contract import EXIT_INTERRUPTED
from evq.worker.errors import Aborted, EvqError, MaxFailures
from evq.worker.logs import get_logger

T = TypeVar("T")
log = get_logger("evq.cli")

PROGRESS_ROWS = 100
PROGRESS_SECONDS = 2.0


@dataclass
class Tally(Generic[T]):
    total: int
    results: list[dict[str, Any]] = field(default_factory=list)
    succeeded: int = 0
    failed: int = 0

    @property
    def summary(self) -> dict[str, Any]:
        return {
            "succeeded": self.succeeded,
            "failed": self.failed,
            "not_attempted": self.total - len(self.results),
            "results": self.results,
        }


@asynccontextmanager
async def interruptible(what: str, *, unit: str = "row", enabled: bool = True) -> AsyncIterator[asyncio.Event]:
    """An event set by the first SIGINT or SIGTERM while the block runs; the loop inside checks
    it between rows and stops (raising Aborted with what it did). The second signal exits 130
    at once. ``enabled=False`` (inside a server): the signals are the server's to handle."""
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            print(f"{what}: stopping after the current {unit} (Ctrl-C again to quit at once)", file=sys.stderr)
            stop.set()
        else:
            os._exit(EXIT_INTERRUPTED)

    loop = asyncio.get_running_loop()
    handled = (signal.SIGINT, signal.SIGTERM) if enabled else ()
    for sig in handled:
        loop.add_signal_handler(sig, on_signal)
    try:
        yield stop
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


async def each(
    items: Sequence[T],
    action: Callable[[T], Awaitable[dict[str, Any]]],
    *,
    key: Callable[[T], dict[str, Any]],
    what: str,
    max_failures: int | None = None,
    handle_signals: bool = True,
) -> Tally[T]:
    """Run ``action`` on every item; a failing item is recorded (``key(item)`` + its error), not raised.

    Raises Aborted or MaxFailures (with the tally in ``context``) when the work stops early.
    ``handle_signals=False`` inside a server: the process's signals are the server's to handle.
    """
    tally: Tally[T] = Tally(total=len(items))
    async with interruptible(what, enabled=handle_signals) as stop:
        return await _each(items, action, key=key, what=what, max_failures=max_failures, tally=tally, stop=stop)


async def _each(
    items: Sequence[T],
    action: Callable[[T], Awaitable[dict[str, Any]]],
    *,
    key: Callable[[T], dict[str, Any]],
    what: str,
    max_failures: int | None,
    tally: Tally[T],
    stop: asyncio.Event,
) -> Tally[T]:
    consecutive = 0
    last_progress = time.monotonic()
    for done, item in enumerate(items, start=1):
        if stop.is_set():
            raise Aborted(
                f"{what}: stopped by an interrupt after {len(tally.results)} of {tally.total} rows "
                f"({tally.succeeded} done, {tally.failed} failed)",
                hint="run the same command again for the rest",
                context=tally.summary,
            )
        try:
            result = await action(item)
        except EvqError as exc:
            tally.failed += 1
            consecutive += 1
            tally.results.append({**key(item), "outcome": "failed", "error": exc.to_dict()})
            if max_failures is not None and consecutive >= max_failures:
                raise MaxFailures(
                    f"{what}: stopped after {consecutive} consecutive failures "
                    f"({tally.succeeded} done, {tally.failed} failed, of {tally.total})",
                    hint="the last error is in context.results; fix its cause and run again",
                    context=tally.summary,
                ) from None
        else:
            tally.succeeded += 1
            consecutive = 0
            tally.results.append({**key(item), "outcome": "succeeded", **result})
        now = time.monotonic()
        if done % PROGRESS_ROWS == 0 or now - last_progress >= PROGRESS_SECONDS:
            last_progress = now
            log.info(
                "progress", work=what, done=done, total=tally.total, succeeded=tally.succeeded, failed=tally.failed
            )
    return tally
