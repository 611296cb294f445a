"""`evq steps wait`, `GET /v1/steps/{id}?wait=30s` and `evq_steps_wait`: one step's view as
soon as it is worth acting on, so an agent does not poll (docs/design.md, "The ambiguity contract").

Worth acting on: any ``next_action`` but ``wait`` and ``wait_for_approval``. A held step is waited
on too (issue 30: every agent send may be held, and the agent's wait must end when a person
decides): approved, it keeps waiting through the send until the step is sent or fails; denied or
expired, it answers ``rejected``. The agent knows it is held from the enqueue's answer already
(``next_action`` and ``approval``). At the timeout the view is answered as it is, with
``meta.timed_out: true``: nobody decided yet, or it is still being sent; the caller calls again.

The wait polls the store with a backoff (0.1 s growing to 1 s): each poll is one short read of
the step's row (``list_steps`` by id) on a pooled connection taken for that read only, so a
thousand waiting agents hold no connection between polls and a pool of ten serves them all.
LISTEN would need a connection per waiter for the whole wait (and none at all behind a
transaction pooler); a second's delay is nothing next to a send's.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from contextlib import contextmanager

from evq.ops.app.service import WAIT_MAX as WAIT_MAX  # the bound, stated in every held step's answer
from evq.ops.app.service import Caller, Reply, show_step, verdict_view
from evq.worker.errors import InvalidRequest, NotFound
from evq.worker.ports import AppStore, StepFilter

WAIT_DEFAULT = "30s"
# The next_actions a wait waits through: evq still working on it, or a person still to decide.
WAITING = ("wait", "wait_for_approval")
FIRST_POLL = 0.1
LAST_POLL = 1.0
_WAIT = re.compile(r"^(\d{1,5}(?:\.\d{1,3})?)\s*(ms|s|m)?$")
_SCALE = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


class WaitSlots:
    """How many waits may be under way at once, in all and per caller (API key): a wait holds an
    HTTP connection for up to a minute, so without a bound one key's thousand waits would take
    every connection `evq serve` allows and lock operators out of the page and the API. A wait
    without a slot answers at once, as its timeout would (``meta.timed_out``): the caller polls,
    nothing is refused. One event loop uses it (no lock needed)."""

    def __init__(self, total: int, per_caller: int) -> None:
        self.total, self.per_caller = total, per_caller
        self.by_caller: dict[str, int] = {}

    @contextmanager
    def slot(self, caller: Caller) -> Iterator[bool]:
        who = hashlib.sha256((caller.key or "").encode()).hexdigest()  # never the key itself
        if sum(self.by_caller.values()) >= self.total or self.by_caller.get(who, 0) >= self.per_caller:
            yield False
            return
        self.by_caller[who] = self.by_caller.get(who, 0) + 1
        try:
            yield True
        finally:
            self.by_caller[who] -= 1
            if not self.by_caller[who]:
                del self.by_caller[who]


def parse_wait(text: str, *, field: str = "--timeout") -> float:
    """``30s``, ``1m``, ``500ms`` or bare seconds (``30``) -> seconds, 0 to :data:`WAIT_MAX`."""
    match = _WAIT.match(str(text).strip())
    if not match:
        raise InvalidRequest(
            [{"field": field, "message": f"expected a duration like 30s, 1m or 500ms, got {str(text)[:40]!r}"}]
        )
    seconds = float(match[1]) * _SCALE[match[2]]
    if seconds > WAIT_MAX:
        raise InvalidRequest([{"field": field, "message": f"at most {WAIT_MAX:g}s, got {str(text)[:40]!r}"}])
    return seconds


async def _next_action(store: AppStore, step_id: int, unresolvable: Collection[str] | None) -> str:
    rows, _ = await store.list_steps(StepFilter(ids=(step_id,), limit=1))
    if not rows:
        # Pruned while we waited: as gone as if it never was.
        raise NotFound(f"no step with id {step_id}", hint="`evq steps list` shows the ids")
    r = rows[0]
    v = verdict_view(
        str(r.status),
        r.reason,
        maybe_delivered=r.maybe_delivered,
        provider=r.provider,
        unresolvable=unresolvable,
        unknown_since=r.unknown_since,
    )
    return str(v["next_action"])


async def wait_step(
    store: AppStore,
    caller: Caller,
    step_id: int,
    *,
    timeout: float,
    unresolvable: Collection[str] | None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    slots: WaitSlots | None = None,
) -> Reply:
    """The step's `steps show` view once its ``next_action`` is neither ``wait`` nor
    ``wait_for_approval`` (:data:`WAITING`), or at ``timeout``
    seconds (``meta.timed_out``); ``meta.waited_ms`` says how long it waited. The first read is
    the whole view (it checks the key and that the step exists); the polls read the row only."""
    if slots is not None:
        with slots.slot(caller) as granted:
            return await wait_step(
                store, caller, step_id, timeout=timeout if granted else 0.0, unresolvable=unresolvable,
                clock=clock, sleep=sleep,
            )  # fmt: skip
    started = clock()
    deadline = started + timeout
    first = await show_step(store, caller, step_id, unresolvable=unresolvable)
    action = first.data["step"]["next_action"]
    delay = FIRST_POLL
    polled = False
    while action in WAITING:
        left = deadline - clock()
        if left <= 0:
            break
        await sleep(min(delay, left))
        delay = min(delay * 2, LAST_POLL)
        action = await _next_action(store, step_id, unresolvable)
        polled = True
    reply = await show_step(store, caller, step_id, unresolvable=unresolvable) if polled else first
    # The answer is the view read last: its own next_action decides whether the wait ended early.
    timed_out = reply.data["step"]["next_action"] in WAITING
    meta = {**reply.meta, "timed_out": timed_out, "waited_ms": round((clock() - started) * 1000)}
    return Reply(reply.data, meta, reply.status)
