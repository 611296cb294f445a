"""One attempt through a provider adapter, reduced to exactly one outcome.

The adapter classifies its own failures (only it knows the protocol phase). This
is the backstop for what it did not classify: an exception or a missed deadline
may have happened after the provider took the request, so it is ``Unknown`` —
the conservative answer that never leads to a silent second send.
"""

from __future__ import annotations

import asyncio
import time

from worker import metrics
from worker.logs import get_logger
from worker.outcomes import Outcome, Unknown
from worker.ports import Provider, SendRequest

log = get_logger("evq.executor")


async def attempt(provider: Provider, request: SendRequest, *, deadline: float) -> tuple[Outcome, float]:
    """Call the adapter once; return its outcome and the latency in milliseconds."""
    started = time.perf_counter()
    task = asyncio.ensure_future(provider.send(request))
    try:
        done, _ = await asyncio.wait({task}, timeout=deadline)
        if not done:
            # A paused process (SIGSTOP, a frozen VM) wakes with its deadline long
            # past and, often, the provider's answer already in its socket: give that
            # answer a moment to arrive before calling the attempt unknown.
            done, _ = await asyncio.wait({task}, timeout=min(1.0, deadline / 10))
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        outcome: Outcome = Unknown(
            f"the {provider.name} adapter gave no answer within {deadline:g}s",
            response={"error_class": "DeadlineExceeded"},
        )
    elif task.exception() is not None:
        exc = task.exception()
        log.error("adapter_raised", provider=provider.name, error_class=type(exc).__name__, exc_info=exc)
        outcome = Unknown(
            f"the {provider.name} adapter raised {type(exc).__name__}",
            response={"error_class": type(exc).__name__},
        )
    else:
        outcome = task.result()
    elapsed = time.perf_counter() - started
    metrics.SEND_ATTEMPTS.labels(provider=provider.name, outcome=outcome.kind).inc()
    metrics.SEND_SECONDS.labels(provider=provider.name, outcome=outcome.kind).observe(elapsed)
    return outcome, elapsed * 1000.0
