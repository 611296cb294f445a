"""One send: the task that calls the adapter for a held row, decides the transition,
hands it to the recorder and frees its slot.

This is the worker's hot path, tuned per step (issue 31): the split out of
worker/runner.py moved it unchanged, local caching and fast paths included.
``Sending`` is a mixin of ``Worker``: ``_send`` is the worker's own method, reached as
``self._send`` with no call between, and the attributes named below are set by
``Worker.__init__``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from evq.worker import executor, logs, metrics, streaks
from evq.worker.backoff import Backoff
from evq.worker.circuit import CircuitBook, Verdict
from evq.worker.config import WorkerConfig
from evq.worker.held_rows import Held
from evq.worker.logs import get_logger
from evq.worker.outcome_writer import Recorder
from evq.worker.ports import Provider, SendRequest
from evq.worker.ratelimit import RateGate
from evq.worker.records import positional_builder
from evq.worker.states import TERMINAL
from evq.worker.streaks import FailureStreaks
from evq.worker.transitions import decide

if TYPE_CHECKING:
    from evq.worker.runner import RunStats

# The worker's logger name, as before the split: every line keeps its logger.
log = get_logger("worker")

_build_request = positional_builder(SendRequest)


def _domain(payload: Mapping[str, Any]) -> str | None:
    """The first recipient's domain: enough to tell where a send went, not to whom."""
    to = payload.get("to") or []
    first = to[0] if to else None
    # type() before isinstance(): an ABC check costs more than the rest of this, once a send.
    address = str(first.get("email") or "") if type(first) is dict or isinstance(first, Mapping) else str(first or "")
    return address.rsplit("@", 1)[1].rstrip(">").lower() if "@" in address else None


class Sending:
    # Set by Worker.__init__ (annotations only: no class attribute, nothing at run time).
    settings: WorkerConfig
    providers: dict[str, Provider]
    backoff: Backoff
    recorder: Recorder
    rates: RateGate
    circuits: CircuitBook
    streaks: FailureStreaks
    stats: RunStats
    _held: dict[int, Held]
    _began: dict[Held, Any]
    _tasks: dict[Held, asyncio.Task[None]]
    _answered: int
    _slot_freed: asyncio.Event
    _log: Any
    _debug: bool

    if TYPE_CHECKING:

        async def _circuit_act(self, provider: str, verdict: Verdict, *, probe: bool) -> None: ...

    async def _send(self, held: Held) -> None:
        step = held.step
        # Bound in this task's own context (a copy made when the task was created, gone
        # with it, so nothing needs unbinding): every line logged during the send, the
        # adapter's included, carries the step's identity.
        logs.bind_step(
            {
                "run_id": step.run_id,
                "step_id": step.step_id,
                "step": step.id,
                "attempt": step.attempt,
                "idempotency_key": step.idempotency_key,
                "provider": step.provider,
            }
        )
        try:
            # A task first runs on the loop's next turn: a shutdown in between has
            # already handed the row back.
            if held.released:
                return
            held.started = True
            self._began[held] = step.lease_token
            provider = self.providers[step.provider]
            bounds = held.bounds
            # SendRequest's fields in order: step_id, run_id, idempotency_key, message_id,
            # attempt, payload, deadline, send_by.
            request = _build_request(
                step.id,
                step.run_id,
                step.idempotency_key,
                step.message_id,
                step.attempt,
                step.payload,
                bounds.deadline,
                bounds.send_by,
            )
            if self._debug:
                self._log.debug("send_started")
            outcome, latency_ms = await executor.attempt(
                provider, request, deadline=max(0.0, bounds.deadline - time.monotonic())
            )
            window_open = (
                provider.dedupe_window is not None
                and step.dedupe_remaining is not None
                and held.claimed_at + step.dedupe_remaining - time.monotonic() > self.settings.lease_seconds
            )
            verdict = self.circuits.observe(step.provider, outcome, probe=held.probe)
            streak = self.streaks.observe(step.provider, outcome)
            if streak is not None:
                log.warning("sends_failing", message=streaks.message(streak), **streak.fields())
            transition = decide(
                step,
                outcome,
                default_max_attempts=self.settings.max_attempts,
                backoff=self.backoff,
                dedupe_window_open=window_open,
                latency_ms=latency_ms,
                retry_for=self.settings.retry_for,
                charged=verdict.charged,
            )
            if not verdict.charged:
                metrics.labelled(metrics.UNCHARGED_ATTEMPTS, step.provider).inc()
            if verdict.trip is not None or verdict.close:
                await self._circuit_act(step.provider, verdict, probe=held.probe)
            kind = outcome.kind
            if kind == "retryable" and outcome.throttled:  # type: ignore[union-attr]
                await self._throttled(step.provider, outcome.retry_after)  # type: ignore[union-attr]
            stats = self.stats
            stats.sent += 1
            stats.outcomes[kind] = stats.outcomes.get(kind, 0) + 1
            held.answered = True
            self._answered += 1
            self._slot_freed.set()
            result = await self.recorder.submit(transition)
            # Written (or fenced out: the row is no longer this lease's): no longer ours to guard.
            self._began.pop(held, None)
            if (result.applied and transition.to_status in TERMINAL) or result.settled:
                # created_at is the database's clock and now is this host's: only NTP-sized skew.
                metrics.observe_closed_now(step.created_at)
            if result.applied:
                if kind == "accepted":
                    # One line per accepted send, so a working worker shows it works: who
                    # (step) went where (provider, its message id); the recipient only by
                    # its domain and never the subject (the evidence holds the rest).
                    self._log.info(
                        "send_accepted",
                        provider_message_id=transition.provider_message_id,
                        to_domain=_domain(step.payload),
                        latency_ms=round(latency_ms, 1),
                    )
                else:
                    self._log.info(
                        "send_recorded",
                        outcome=kind,
                        status=str(transition.to_status),
                        reason=str(transition.reason),
                        provider_message_id=transition.provider_message_id,
                        latency_ms=round(latency_ms, 1),
                    )
            else:
                stats.fenced += 1
                metrics.FENCE_REJECTIONS.inc()
                if result.settled:
                    metrics.LATE_SETTLEMENTS.inc()
                log.warning(
                    "late_answer",
                    outcome=kind,
                    settled=result.settled,
                    duplicate=result.duplicate,
                    note="the lease was lost before the answer was recorded; kept as evidence",
                )
        except asyncio.CancelledError:
            raise
        except Exception:
            # A bug between the adapter's answer and the recorder (the recorder itself
            # retries every error). If the send began, its token stays in _began for good:
            # no path of this worker hands the row back; the rescuer makes it unknown.
            log.exception("send_not_recorded", send_began=held.started)
        finally:
            # The slot is freed; the guard against handing the row back is _began.
            if self._held.pop(step.id, None) is not None and held.answered:
                self._answered -= 1
            self._tasks.pop(held, None)
            self._slot_freed.set()

    async def _throttled(self, provider: str, retry_after: float | None) -> None:
        try:
            await self.rates.throttled(provider, retry_after)
        except Exception as exc:
            # This worker pauses anyway (in memory); the others learn of it from their own 429s.
            # Never let it keep the outcome from being recorded.
            log.warning(
                "provider_pause_not_shared",
                provider=provider,
                error_class=type(exc).__name__,
                error=getattr(exc, "message", None) or str(exc)[:200],
            )
