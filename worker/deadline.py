"""One attempt's time limits on the monotonic clock (invariant 9).

The worker knows when it asked for the lease and how long it is; the adapter is
the one that knows when it is about to do the irreversible step (the final "." of
DATA, writing the HTTP request). These two instants, carried on the request, let
it ask "may I still?" at that very moment:

* ``deadline``: the whole exchange ends by then; an adapter cuts off a send that is
  still talking and classifies it by how far it got. Per-read timeouts alone never
  end a peer that trickles its reply a byte at a time.
* ``send_by``: the irreversible step must not begin after it. What is left of the
  lease then still covers the provider's answer and its recording, so the rescuer
  never meets a send that is still going out. A process paused (SIGSTOP, a frozen
  VM) wakes with it long past: ``time.monotonic()`` counts the paused time, so the
  send is abandoned, retryable, with nothing sent.

Both are measured from when the claim was *asked for*, which is no later than the
database's start of the lease: the worker's view of its lease can only be shorter
than the real one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Shares of the lease. The exchange is cut at three quarters (the rest leaves time
# to record the outcome); the irreversible step must begin in the first half, so a
# quarter of the lease is left for the provider's answer before the cut.
DEADLINE_SHARE = 0.75
SEND_BY_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Limits:
    deadline: float  # monotonic
    send_by: float  # monotonic


def limits(lease_from: float, lease_seconds: float) -> Limits:
    return Limits(
        deadline=lease_from + lease_seconds * DEADLINE_SHARE, send_by=lease_from + lease_seconds * SEND_BY_SHARE
    )


def left(instant: float | None, *, now: float | None = None) -> float | None:
    """Seconds until a monotonic instant (negative once past), or None when there is none."""
    if instant is None:
        return None
    return instant - (time.monotonic() if now is None else now)


def bounded(timeout: float, instant: float | None) -> float:
    """A per-operation timeout that never reaches past ``instant`` (at least a millisecond,
    so a socket is never switched to non-blocking by a zero)."""
    remaining = left(instant)
    return timeout if remaining is None else max(0.001, min(timeout, remaining))


def may_send(send_by: float | None) -> bool:
    """Whether the irreversible step may still begin. Call it after everything that can block."""
    return send_by is None or time.monotonic() < send_by
