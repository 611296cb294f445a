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
answers pile up. A waiting row's lease token stays in the worker's "send began" set
until its outcome is written, and the orphan check hands back only rows of claims
whose answer was lost (worker/held_rows.py), so it can never release a row already sent.
The claim and the record use separate pool connections, so one batch's outcomes
are written while the next batch is being claimed.
Every error is retried with backoff, not only "database unavailable" (unlike Oban,
which retries on database errors only): an outcome that failed to be written for
a reason nobody classified (a statement a pooler broke, a bug) is still the
provider's answer, and forgetting it would leave a send in the worker's memory
as if it had never begun. A batch that fails for an unclassified reason is then
written one outcome at a time, so one outcome that cannot be written holds back
only itself; each waits its own backoff, never the whole recorder's. An outcome
that never gets written is the rescuer's once its lease expires (``unknown``),
and a write that lands after that is fenced and kept as late evidence.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from evq.worker.backoff import reconnect_delay
from evq.worker.errors import DatabaseUnavailable
from evq.worker.logs import get_logger
from evq.worker.ports import RecordStore
from evq.worker.records import RecordResult, Transition

log = get_logger("evq.recorder")


@dataclass(slots=True, eq=False)
class _Waiting:
    transition: Transition
    future: asyncio.Future[RecordResult]
    failures: int = 0
    alone: bool = False  # written on its own since its batch failed for an unclassified reason
    not_before: float = 0.0  # loop time of its next write


class Recorder:
    def __init__(self, store: RecordStore, *, actor: str, max_batch: int = 1000, retry_max_wait: float = 5.0):
        self.store = store
        self.actor = actor
        self.max_batch = max_batch
        self.retry_max_wait = retry_max_wait
        self._queue: list[_Waiting] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0
        self.retries = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="evq-recorder")

    async def submit(self, transition: Transition) -> RecordResult:
        """The stored result of ``transition``; waits (retrying) until it is written or the recorder stops."""
        future: asyncio.Future[RecordResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(transition, future))
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
        for waiting in self._queue:
            transition = waiting.transition
            # Never written: the row stays in flight and the rescuer makes it unknown.
            log.error(
                "outcome_not_recorded",
                step=transition.step_id,
                attempt=transition.attempt,
                outcome=transition.outcome,
                provider_message_id=transition.provider_message_id,
            )
            if not waiting.future.done():
                waiting.future.cancel()
        self._queue.clear()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._due(loop.time())
            if not batch:
                await self._idle(loop)
                continue
            try:
                results = await self.store.record([w.transition for w in batch], actor=self.actor)
            except Exception as exc:
                self._failed(batch, exc, loop.time())
                continue
            self.flushes += 1
            by_id = {r.step_id: r for r in results}
            done = set(map(id, batch))
            self._queue = [w for w in self._queue if id(w) not in done]
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_result(by_id[waiting.transition.step_id])

    def _due(self, now: float) -> list[_Waiting]:
        due = [w for w in self._queue if w.not_before <= now]
        if not due:
            return []
        if due[0].alone:
            return [due[0]]
        return [w for w in due if not w.alone][: self.max_batch]

    async def _idle(self, loop: asyncio.AbstractEventLoop) -> None:
        self._wake.clear()
        waits = [w.not_before for w in self._queue]
        timeout = max(0.0, min(waits) - loop.time()) if waits else None
        try:
            await asyncio.wait_for(self._wake.wait(), timeout)
        except TimeoutError:
            pass

    def _failed(self, batch: list[_Waiting], exc: Exception, now: float) -> None:
        self.retries += 1
        unavailable = isinstance(exc, DatabaseUnavailable)
        split = not unavailable and len(batch) > 1
        for waiting in batch:
            waiting.failures += 1
            if split:
                waiting.alone = True  # retried at once, one by one
            else:
                waiting.not_before = now + reconnect_delay(waiting.failures, initial=0.05, maximum=self.retry_max_wait)
        fields = dict(
            outcomes=len(batch),
            attempt=max(w.failures for w in batch),
            error_class=type(exc).__name__,
            error=getattr(exc, "message", None) or str(exc)[:300],
            note="retried until written; the sends stay held meanwhile",
        )
        if unavailable:
            log.warning("record_retry", **fields)
        else:
            # Nobody classified this error: loud, with its traceback, and still retried.
            # Its traceback once per outcome, not at every retry.
            first = any(w.failures == 1 for w in batch)
            log.error("record_retry", unclassified=True, exc_info=exc if first else None, **fields)
