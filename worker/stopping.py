"""The worker's stop: hand back held rows whose send has not begun, let in-flight sends
finish and record within ``shutdown_grace``, hand back lost claims; and what a drain
leaves unsent, and why, for its summary.

``Stopping`` is a mixin of ``Worker`` (worker/runner.py), split out of it by what it
does: its methods are the worker's own, reached as ``self.<name>`` with no call
between, and the attributes named below are set by ``Worker.__init__``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from evq.worker.circuit import CircuitState
from evq.worker.config import WorkerConfig
from evq.worker.held_rows import Held
from evq.worker.logs import get_logger
from evq.worker.outcome_writer import Recorder
from evq.worker.ports import Provider, Wakeup, WorkerStore

if TYPE_CHECKING:
    from evq.worker.runner import RunStats

# The worker's logger name, as before the split: every line keeps its logger.
log = get_logger("worker")


class Stopping:
    # Set by Worker.__init__ (annotations only: no class attribute, nothing at run time).
    store: WorkerStore
    settings: WorkerConfig
    owner: str
    providers: dict[str, Provider]
    recorder: Recorder
    wakeup: Wakeup
    stats: RunStats
    _held: dict[int, Held]
    _tasks: dict[Held, asyncio.Task[None]]
    _waiting: list[dict[str, Any]]

    if TYPE_CHECKING:

        async def _hand_back_lost_claims(self, until: float) -> None: ...

    async def _shutdown(self) -> bool:
        until = time.monotonic() + self.settings.shutdown_grace
        unstarted = [h for h in self._held.values() if not h.started]
        for h in unstarted:
            h.released = True
        clean = True
        if unstarted:
            try:
                n = await self.store.release([h.step for h in unstarted], actor=self.owner)
                self.stats.released += n
                log.info("claims_released", count=n)
            except Exception as exc:
                # Left in flight: the rescuer makes them unknown (a look for an operator, never a resend).
                log.warning(
                    "release_failed",
                    count=len(unstarted),
                    error_class=type(exc).__name__,
                    error=getattr(exc, "message", None) or str(exc)[:300],
                )
        for h in unstarted:
            if h.probe:
                # The probe never went out: its hold would keep every worker from the
                # provider for a whole lease; back to open, probed again after the base delay.
                try:
                    await self.store.circuit_probe_idle(
                        provider=h.step.provider,
                        owner=self.owner,
                        probe_base=self.settings.circuit_probe_base,
                        detail="the worker stopped before sending the probe; its step was handed back",
                    )
                except Exception as exc:
                    log.warning(
                        "circuit_probe_not_returned",
                        provider=h.step.provider,
                        error_class=type(exc).__name__,
                        error=getattr(exc, "message", None) or str(exc)[:200],
                    )
        pending = [t for t in self._tasks.values() if not t.done()]
        if pending:
            log.info("waiting_for_in_flight", count=len(pending), grace=self.settings.shutdown_grace)
            _, still = await asyncio.wait(pending, timeout=self.settings.shutdown_grace)
            if still:
                clean = False
                log.warning("grace_expired", left_in_flight=len(still))
                for task in still:
                    task.cancel()
                await asyncio.gather(*still, return_exceptions=True)
        await self._hand_back_lost_claims(until)
        await self.recorder.stop()
        await self.wakeup.close()
        return clean

    async def _drain_report(self) -> None:
        """What a drain leaves unsent, and why, for its summary: per provider, the steps due now
        that its circuit holds back (a drain after the cause was fixed claims nothing until the
        circuit's probe is due: it must not read as "nothing to send"), the steps scheduled
        later (send_at, a retry's backoff) and the steps waiting for approval. Best effort: the
        drain's work is done, and a summary without it still says what was sent."""
        try:
            counts = await self.store.waiting(providers=sorted(self.providers))
            circuits = {r["provider"]: r for r in await self.store.circuits()}
        except Exception as exc:
            log.warning(
                "drain_report_failed",
                error_class=type(exc).__name__,
                error=getattr(exc, "message", None) or str(exc)[:300],
            )
            return
        self._waiting = []
        for c in counts:
            row: dict[str, Any] = {
                "provider": c["provider"],
                "due": c["due"],
                "later": c["later"],
                "next_at": _iso(c["next_at"]),
                "held": c["held"],
                "circuit": None,
            }
            circuit = circuits.get(c["provider"])
            if circuit is not None and circuit["state"] != CircuitState.CLOSED:
                # Half-open: a probe is out; the next one may start when its hold ends.
                probe_at = circuit["probe_at"] or circuit["probe_expires_at"]
                row["circuit"] = {
                    "state": str(circuit["state"]),
                    "reason": circuit["reason"],
                    "detail": circuit["detail"],
                    "since": _iso(circuit["opened_at"]),
                    "next_probe_at": _iso(probe_at),
                }
                if c["due"] or c["later"]:
                    log.warning(
                        "steps_wait_for_circuit",
                        provider=c["provider"],
                        due=c["due"],
                        later=c["later"],
                        **row["circuit"],
                        note="the circuit lets one step through at next_probe_at; until a probe gets through "
                        "no worker sends to this provider",
                    )
            self._waiting.append(row)


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z") if at is not None else None
