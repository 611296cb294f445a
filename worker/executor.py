"""One attempt through a provider adapter, reduced to exactly one outcome.

The adapter classifies its own failures (only it knows the protocol phase). This
is the backstop for what it did not classify: an exception or a missed deadline
may have happened after the provider took the request, so it is ``Unknown`` —
the conservative answer that never leads to a silent second send.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from typing import Any

from evq.worker import metrics
from evq.worker.logs import get_logger
from evq.worker.outcomes import Outcome, Unknown, refused_recipients
from evq.worker.ports import Provider, SendRequest
from evq.worker.secret_scrub import scrub_record

log = get_logger("evq.executor")

BACKSTOP_GRACE = 1.0  # seconds past the deadline before the backstop answers Unknown


async def attempt(provider: Provider, request: SendRequest, *, deadline: float) -> tuple[Outcome, float]:
    """Call the adapter once; return its outcome and the latency in milliseconds.

    The adapter runs in the caller's task (no task of its own: this is the hot
    path), under a backstop that is armed only when the deadline passes.
    """
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("an attempt runs inside a task")
    # A paused process (SIGSTOP, a frozen VM) wakes with its deadline long past and, often,
    # the provider's answer already in its socket: the deadline only arms a short grace,
    # measured from when the loop runs again. The grace is also what an adapter that enforces
    # the deadline itself (worker/deadline.py) gets to report how far a cut-off send had got.
    guard = _Backstop(task)
    key = _watch_for(loop).add(loop.time() + deadline, guard)
    outcome: Outcome
    left: int | None = None
    try:
        try:
            outcome = await provider.send(request)
        finally:
            guard.disarm(key)
            # What asyncio.timeout does on the way out once it has cancelled the task: the
            # cancellation it asked for is taken back (what is left says whether anyone else
            # asked for one too).
            if guard.fired:
                left = task.uncancel()
    except asyncio.CancelledError:
        if left is None or left > guard.cancelling:
            raise  # not the backstop's, or not only: the task is being cancelled
        outcome = _missed(provider, deadline)
    except TimeoutError as exc:
        outcome = _missed(provider, deadline) if guard.fired else _raised(provider, exc)
    except Exception as exc:
        outcome = _raised(provider, exc)
    elapsed = time.perf_counter() - started
    # This is where a provider's words become evidence (a step's reason and detail, then
    # outputs, pages and failure notices): no configured secret, in any encoding, gets past
    # it, whatever the adapter's own scrubbing missed.
    outcome = scrub_record(outcome)
    name = provider.name
    kind = outcome.kind
    metrics.labelled(metrics.SEND_ATTEMPTS, name, kind).inc()
    metrics.labelled(metrics.SEND_SECONDS, name, kind).observe(elapsed)
    if kind == "accepted" and outcome.response and (refused := refused_recipients(outcome.response)):
        metrics.RECIPIENTS_REFUSED.labels(provider=name).inc(len(refused))
    return outcome, elapsed * 1000.0


def _missed(provider: Provider, deadline: float) -> Outcome:
    return Unknown(
        f"the {provider.name} adapter gave no answer within {deadline:g}s",
        response={"error_class": "DeadlineExceeded"},
    )


class _Backstop:
    """One attempt's deadline, as ``asyncio.timeout(None)`` rescheduled by the watch would be, at a
    fraction of its cost (an object, two coroutines for ``async with`` and its state machine on
    every send): when the grace after the deadline runs out, the attempt's task is cancelled,
    and attempt() tells that cancellation from any other exactly as asyncio.timeout does (the
    count of cancellation requests on the task when the attempt began)."""

    __slots__ = ("task", "cancelling", "handle", "fired", "watch")

    def __init__(self, task: asyncio.Task[Any]):
        self.task = task
        self.cancelling = task.cancelling()
        self.handle: asyncio.TimerHandle | None = None
        self.fired = False
        self.watch: _Watch | None = None

    def arm(self, when: float, loop: asyncio.AbstractEventLoop) -> None:
        """The deadline has passed: the grace starts now."""
        self.handle = loop.call_at(when, self._expire)

    def _expire(self) -> None:
        self.handle = None
        self.fired = True
        self.task.cancel()

    def disarm(self, key: int) -> None:
        if self.watch is not None:
            self.watch.remove(key)
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class _Watch:
    """The deadlines of every attempt in flight on one event loop, behind one timer set for the
    earliest. A timer per attempt cost a push and a pop on the loop's heap of timers, each
    comparing handles in Python, on every send; here a send costs a dict entry, and the timer
    moves only when an attempt's deadline comes before every other's (attempts are claimed in
    order, so their deadlines mostly come later). When it fires, every attempt past its deadline
    gets the grace (its backstop armed), as a timer of its own would have given it."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.entries: dict[int, tuple[float, _Backstop]] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.armed_at = math.inf
        self._next = 0

    def add(self, when: float, backstop: _Backstop) -> int:
        key = self._next = self._next + 1
        self.entries[key] = (when, backstop)
        backstop.watch = self
        if when < self.armed_at:
            self._arm(when)
        return key

    def remove(self, key: int) -> None:
        self.entries.pop(key, None)

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_at(when, self._fire)
        self.armed_at = when

    def _fire(self) -> None:
        self.timer = None
        self.armed_at = math.inf
        # The loop runs a timer up to its clock's resolution early: a millisecond of slack,
        # so a deadline reached is never put off to a timer of its own.
        now = self.loop.time()
        later = math.inf
        for key, (when, backstop) in list(self.entries.items()):
            if when <= now + 0.001:
                del self.entries[key]
                backstop.arm(now + BACKSTOP_GRACE, self.loop)
            else:
                later = min(later, when)
        if later < math.inf:
            self._arm(later)


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = weakref.WeakKeyDictionary()
# The loop last asked about (a weak reference) and its watch: a worker asks about one loop,
# and a weak mapping's lookup makes a weak reference on every call.
_last: tuple[Any, _Watch | None] = (None, None)


def _watch_for(loop: asyncio.AbstractEventLoop) -> _Watch:
    global _last
    ref, watch = _last
    if ref is not None and watch is not None and ref() is loop:
        return watch
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = _Watch(loop)
    _last = (weakref.ref(loop), watch)
    return watch


def _raised(provider: Provider, exc: BaseException) -> Outcome:
    log.error("adapter_raised", provider=provider.name, error_class=type(exc).__name__, exc_info=exc)
    return Unknown(
        f"the {provider.name} adapter raised {type(exc).__name__}",
        response={"error_class": type(exc).__name__},
    )
