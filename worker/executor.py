"""One attempt through a provider adapter, reduced to exactly one outcome.

The adapter classifies its own failures (only it knows the protocol phase). This
is the backstop for what it did not classify: an exception or a missed deadline
may have happened after the provider took the request, so it is ``Unknown`` —
the conservative answer that never leads to a silent second send.
"""

from __future__ import annotations

import asyncio
import time

from evq.worker import metrics
from evq.worker.logs import get_logger
from evq.worker.outcomes import Accepted, Outcome, Unknown, refused_recipients
from evq.worker.ports import Provider, SendRequest
from evq.worker.scrub import scrub_record

log = get_logger("evq.executor")

BACKSTOP_GRACE = 1.0  # seconds past the deadline before the backstop answers Unknown


async def attempt(provider: Provider, request: SendRequest, *, deadline: float) -> tuple[Outcome, float]:
    """Call the adapter once; return its outcome and the latency in milliseconds.

    The adapter runs in the caller's task (no task of its own: this is the hot
    path), under a timeout that is armed only when the deadline passes.
    """
    started = time.perf_counter()
    loop = asyncio.get_running_loop()
    outcome: Outcome
    try:
        async with asyncio.timeout(None) as timeout:
            # A paused process (SIGSTOP, a frozen VM) wakes with its deadline long
            # past and, often, the provider's answer already in its socket: the
            # deadline only arms a short grace, measured from when the loop runs again.
            # The grace is also what an adapter that enforces the deadline itself
            # (worker/deadline.py) gets to report how far a cut-off send had got.
            grace = BACKSTOP_GRACE
            arm = loop.call_later(deadline, lambda: timeout.reschedule(loop.time() + grace))
            try:
                outcome = await provider.send(request)
            finally:
                arm.cancel()
    except TimeoutError as exc:
        if timeout.expired():
            outcome = Unknown(
                f"the {provider.name} adapter gave no answer within {deadline:g}s",
                response={"error_class": "DeadlineExceeded"},
            )
        else:
            outcome = _raised(provider, exc)
    except Exception as exc:
        outcome = _raised(provider, exc)
    elapsed = time.perf_counter() - started
    # This is where a provider's words become evidence (a step's reason and detail, then
    # outputs, pages and failure notices): no configured secret, in any encoding, gets past
    # it, whatever the adapter's own scrubbing missed.
    outcome = scrub_record(outcome)
    metrics.labelled(metrics.SEND_ATTEMPTS, provider.name, outcome.kind).inc()
    metrics.labelled(metrics.SEND_SECONDS, provider.name, outcome.kind).observe(elapsed)
    if isinstance(outcome, Accepted) and (refused := refused_recipients(outcome.response)):
        metrics.RECIPIENTS_REFUSED.labels(provider=provider.name).inc(len(refused))
    return outcome, elapsed * 1000.0


def _raised(provider: Provider, exc: BaseException) -> Outcome:
    log.error("adapter_raised", provider=provider.name, error_class=type(exc).__name__, exc_info=exc)
    return Unknown(
        f"the {provider.name} adapter raised {type(exc).__name__}",
        response={"error_class": type(exc).__name__},
    )
