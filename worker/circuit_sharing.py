"""The worker's side of the providers' shared circuits (the state machine is worker/circuit.py):
reading their states from the database, taking and claiming the probe of an open one
that is due, and writing what an outcome means for a circuit (a trip, a close).

``CircuitSharing`` is a mixin of ``Worker`` (worker/runner.py), split out of it by what
it does: its methods are the worker's own, reached as ``self.<name>`` with no call
between, and the attributes named below are set by ``Worker.__init__``.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from evq.worker import metrics
from evq.worker.circuit import CircuitBook, CircuitState, Verdict
from evq.worker.config import WorkerConfig
from evq.worker.logs import get_logger
from evq.worker.ports import Provider, WorkerStore
from evq.worker.records import ClaimedStep

# The worker's logger name, as before the split: every line keeps its logger.
log = get_logger("worker")

# Seconds between reads of the providers' circuits while none is due for a probe: how
# soon a worker probes a circuit another worker opened, if that one went away.
CIRCUIT_READ = 5.0


class CircuitSharing:
    # Set by Worker.__init__ (annotations only: no class attribute, nothing at run time).
    store: WorkerStore
    settings: WorkerConfig
    owner: str
    providers: dict[str, Provider]
    circuits: CircuitBook
    dedupe_windows: dict[str, float]
    _circuits_read_at: float
    _stopping: asyncio.Event

    if TYPE_CHECKING:

        async def _claim_statement(self, **kwargs: Any) -> list[ClaimedStep]: ...

    async def _circuit_pass(self) -> list[ClaimedStep]:
        """Learn the circuits' states; take and claim the probe of each open one that is due."""
        now = time.monotonic()
        if now < self._circuits_read_at:
            return []
        s = self.settings
        rows = [r for r in await self.store.circuits() if r["provider"] in self.providers]
        self.circuits.learn((r["provider"], CircuitState(r["state"])) for r in rows)
        self._circuits_read_at = now + CIRCUIT_READ
        probes: list[ClaimedStep] = []
        for r in rows:
            if r["state"] == CircuitState.OPEN and r["probe_in"] > 0:
                self._circuits_read_at = min(self._circuits_read_at, now + r["probe_in"])
                continue
            if r["state"] == CircuitState.HALF_OPEN and (r["probe_hold_left"] or 0) > 0:
                self._circuits_read_at = min(self._circuits_read_at, now + r["probe_hold_left"])
                continue
            if r["state"] == CircuitState.CLOSED or self._stopping.is_set():
                continue
            provider = r["provider"]
            if not await self.store.circuit_probe_take(
                provider=provider, owner=self.owner, hold_seconds=s.lease_seconds, lease_seconds=s.lease_seconds
            ):
                continue  # another worker took it, or no step waits
            metrics.labelled(metrics.CIRCUIT_CHANGES, provider, "half_open").inc()
            # Through _claim_statement, so the probe's claim is named too: if its answer is
            # lost (or a later statement of this pass fails and the probe is dropped), the
            # row, never sent, is handed back instead of waiting in flight for the rescuer.
            claimed = await self._claim_statement(
                providers=[provider],
                limit=1,
                probe=True,
                owner=self.owner,
                lease_seconds=s.lease_seconds,
                dedupe_windows=self.dedupe_windows,
            )
            if not claimed:
                await self.store.circuit_probe_idle(
                    provider=provider, owner=self.owner, probe_base=s.circuit_probe_base
                )
                continue
            log.info(
                "circuit_probe",
                provider=provider,
                step=claimed[0].id,
                probes=r["probes"],
                note="one step let through to see whether the provider is back",
            )
            probes.extend(claimed)
        return probes

    async def _circuit_act(self, provider: str, verdict: Verdict, *, probe: bool) -> None:
        """Write what an outcome means for the provider's circuit; never in the way of recording it."""
        if verdict.trip is None and not verdict.close:
            return
        s = self.settings
        try:
            if verdict.trip is not None:
                row = await self.store.circuit_trip(
                    provider=provider,
                    reason=verdict.trip.reason,
                    detail=verdict.trip.detail,
                    actor=self.owner,
                    probe_base=s.circuit_probe_base,
                    probe_max=s.circuit_probe_max,
                )
                if row is not None:
                    metrics.labelled(metrics.CIRCUIT_CHANGES, provider, "open").inc()
                    self._circuits_read_at = min(self._circuits_read_at, time.monotonic() + row["probe_in"])
                    log.warning(
                        "circuit_opened",
                        provider=provider,
                        reason=verdict.trip.reason,
                        detail=verdict.trip.detail,
                        from_state=row["from_state"],
                        probe_in=round(row["probe_in"], 2),
                        failed_probes=row["probes"],
                        note="no worker sends to this provider until a probe gets through; attempts are not charged",
                    )
            elif await self.store.circuit_close(
                provider=provider,
                reason="probe_succeeded" if probe else "provider_answered",
                detail="the provider answered a send",
                actor=self.owner,
            ):
                metrics.labelled(metrics.CIRCUIT_CHANGES, provider, "closed").inc()
                log.info("circuit_closed", provider=provider, probe=probe)
        except Exception as exc:
            # Every worker still stops for itself (its own view says open); the others
            # learn of it from their own failures.
            log.warning(
                "circuit_not_shared",
                provider=provider,
                error_class=type(exc).__name__,
                error=getattr(exc, "message", None) or str(exc)[:200],
            )
