"""The executor's backstop (docs/design.md, "Invariants", 8): whatever an adapter did not
classify counts as "the provider may have acted", so it can never lead to a silent resend."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from evq.worker import executor
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Unknown
from evq.worker.ports import SendRequest
from evq.worker.records import ClaimedStep
from evq.worker.states import Status
from evq.worker.transitions import decide

REQUEST = SendRequest(step_id=1, run_id="r", idempotency_key="r:s", message_id="<m@x>", attempt=1, payload={})


class _Raising:
    """An adapter that fails in a way it never classified (a bug, a library surprise)."""

    name = "raising"
    dedupe_window = None

    async def send(self, request):
        raise RuntimeError("connection object in an impossible state")

    async def close(self):
        pass


class _Wedged:
    """An adapter that never answers and ignores its own deadline."""

    name = "wedged"
    dedupe_window = None

    async def send(self, request):
        await asyncio.Event().wait()

    async def close(self):
        pass


def test_an_adapter_that_raises_is_unknown():
    outcome, _ = asyncio.run(executor.attempt(_Raising(), REQUEST, deadline=5))
    assert isinstance(outcome, Unknown)
    assert outcome.response["error_class"] == "RuntimeError"


def test_an_adapter_that_misses_its_deadline_is_unknown():
    # The backstop answers a grace (executor.BACKSTOP_GRACE, 1 s) after the deadline.
    outcome, _ = asyncio.run(executor.attempt(_Wedged(), REQUEST, deadline=0.05))
    assert isinstance(outcome, Unknown)
    assert outcome.response["error_class"] == "DeadlineExceeded"


def test_the_backstop_takes_back_its_own_cancellation_and_no_other():
    """The backstop cancels the attempt's task (as asyncio.timeout would): once it answered, the
    task carries no cancellation request of it; a cancellation from outside (a shutdown's) still
    reaches the caller, whether or not the backstop fired too."""

    async def wedged_then_count():
        outcome, _ = await executor.attempt(_Wedged(), REQUEST, deadline=0.01)
        return outcome, asyncio.current_task().cancelling()

    outcome, cancelling = asyncio.run(wedged_then_count())
    assert outcome.response["error_class"] == "DeadlineExceeded" and cancelling == 0

    async def cancelled_from_outside(after: float):
        task = asyncio.create_task(executor.attempt(_Wedged(), REQUEST, deadline=0.01))
        await asyncio.sleep(after)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        return "answered"

    assert asyncio.run(cancelled_from_outside(0.05)) == "cancelled"  # before the grace ran out
    assert asyncio.run(cancelled_from_outside(0.0)) == "cancelled"  # before the attempt began


def test_an_unclassified_error_makes_the_step_unknown_not_retryable():
    outcome, _ = asyncio.run(executor.attempt(_Raising(), REQUEST, deadline=5))
    transition = decide(_claimed(), outcome, default_max_attempts=5, backoff=Backoff(), dedupe_window_open=False)
    assert transition.to_status is Status.UNKNOWN and transition.maybe_delivered


def _claimed() -> ClaimedStep:
    return ClaimedStep(
        id=1,
        run_id="r",
        step_id="s",
        idempotency_key="r:s",
        message_id="<m@x>",
        provider="raising",
        payload={},
        attempt=1,
        max_attempts=None,
        lease_token=uuid.uuid4(),
        lease_seconds=120.0,
        dedupe_remaining=None,
        maybe_delivered=False,
        created_at=datetime.now(UTC),
    )
