"""Group commit of outcomes.

Concurrent sends hand their transitions to one recorder, which writes whatever has
gathered in one fenced statement while the previous write is in flight: no added
latency when idle, few commits when busy.

SAFETY ARGUMENT — why an outcome may wait in memory: the attempt was committed
before the adapter was called (invariant 2), so until its outcome is written the
row is ``in_flight`` under a lease. If this process dies first, the lease expires
and the rescuer makes the row ``unknown`` (or retryable only where the provider
dedupes our key): the send is never lost from view and never silently repeated.
The write itself is fenced by the lease token, so a write retried after a lost
acknowledgement is a no-op (one answer per lease, enforced by a unique index).
How much may wait is bounded: the worker frees a send's slot when the adapter
answers, but holds the row until its outcome is written and never holds more
than twice its concurrency, so a slow database slows claiming instead of letting
answers pile up. A waiting row stays held, so the orphan check (which hands back
claimed rows the worker does not hold) can never release a row already sent.
The claim and the record use separate pool connections, so one batch's outcomes
are written while the next batch is being claimed.
Database errors are retried with backoff (Oban's habit: recording is retried on
database errors only); anything else is a bug and fails the waiting sends loudly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from tenacity import AsyncRetrying, retry_if_exception_type

from worker.backoff import exponential_jitter
from worker.errors import DatabaseUnavailable
from worker.logs import get_logger
from worker.records import RecordResult, Transition

log = get_logger("evq.recorder")


class RecordStore(Protocol):
    async def record(self, transitions: Sequence[Transition], *, actor: str) -> list[RecordResult]: ...


class Recorder:
    def __init__(self, store: RecordStore, *, actor: str, max_batch: int = 1000, retry_max_wait: float = 5.0):
        self.store = store
        self.actor = actor
        self.max_batch = max_batch
        self.retry_max_wait = retry_max_wait
        self._queue: list[tuple[Transition, asyncio.Future[RecordResult]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="evq-recorder")

    async def submit(self, transition: Transition) -> RecordResult:
        future: asyncio.Future[RecordResult] = asyncio.get_running_loop().create_future()
        self._queue.append((transition, future))
        self._wake.set()
        return await future

    async def stop(self) -> None:
        """Stop after everything submitted so far is written (or abandoned by cancel)."""
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        for transition, future in self._queue:
            # Never written: the row stays in flight and the rescuer makes it unknown.
            log.error(
                "outcome_not_recorded",
                step=transition.step_id,
                attempt=transition.attempt,
                outcome=transition.outcome,
                provider_message_id=transition.provider_message_id,
            )
            if not future.done():
                future.cancel()
        self._queue.clear()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._queue[: self.max_batch]
                try:
                    results = await self._write([t for t, _ in batch])
                except Exception as exc:
                    del self._queue[: len(batch)]
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                del self._queue[: len(batch)]
                self.flushes += 1
                by_id = {r.step_id: r for r in results}
                for transition, future in batch:
                    if not future.done():
                        future.set_result(by_id[transition.step_id])

    async def _write(self, transitions: list[Transition]) -> list[RecordResult]:
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(DatabaseUnavailable),
            wait=exponential_jitter(0.05, self.retry_max_wait, 0.05),
            reraise=True,
            before_sleep=lambda state: log.warning(
                "record_retry",
                outcomes=len(transitions),
                attempt=state.attempt_number,
                error=str(state.outcome.exception()) if state.outcome else None,
            ),
        ):
            with attempt:
                return await self.store.record(transitions, actor=self.actor)
        raise AssertionError("unreachable")
