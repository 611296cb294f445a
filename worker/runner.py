"""The worker: claim in batches, send concurrently, record outcomes, rescue, stop cleanly.

Life of one step here: the claim statement commits the attempt (invariant 2); a
task calls the adapter; the decision (worker/transitions.py) becomes a fenced
transition that the recorder group-commits (invariant 3). Rows are claimed only
for free concurrency slots, so a claimed row starts at once and a shutdown has
little to hand back.

Signals: the first SIGTERM/SIGINT stops claiming, releases claimed rows whose send
has not begun, lets in-flight sends finish and record within ``shutdown_grace``,
and returns 0. A second signal exits 130 at once; rows left in flight are the
rescuer's, which is exactly what a crash would leave.

Invariant 8 here: the lease token of every row whose adapter call has begun is in
``_began`` until its outcome is written (or fenced out); nothing removes it on an
error. The only rows this worker ever hands back are rows whose send never began:
unstarted rows at shutdown, and rows of claims whose answer was lost (their lease
tokens derive from the claim id, so the worker names exactly those, and they were
never passed to an adapter). Any error while claiming counts as such a lost claim;
any error while recording is retried (worker/outcome_writer.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from evq.worker import deadline as limits
from evq.worker import executor, logs, metrics, streaks
from evq.worker.approval_actions import ExpirerConfig, HoldExpirer
from evq.worker.backoff import Backoff, reconnect_delay
from evq.worker.circuit import CircuitBook, CircuitState, Verdict
from evq.worker.config import WorkerConfig
from evq.worker.content_retention import Redactor, RedactorConfig
from evq.worker.errors import DatabaseUnavailable, ReadOnlyDatabase
from evq.worker.logs import get_logger
from evq.worker.outcome_writer import Recorder
from evq.worker.ports import Lookup, Provider, SendRequest, Service, Wakeup, WorkerStore
from evq.worker.ratelimit import RateGate
from evq.worker.reconciler import Reconciler, ReconcilerConfig
from evq.worker.records import ClaimedStep, positional_builder
from evq.worker.rescuer import Rescuer, RescuerConfig
from evq.worker.service import run_periodically
from evq.worker.states import TERMINAL
from evq.worker.streaks import FailureStreaks
from evq.worker.transitions import decide

log = get_logger("worker")

_build_request = positional_builder(SendRequest)

# Seconds between reads of the providers' circuits while none is due for a probe: how
# soon a worker probes a circuit another worker opened, if that one went away.
CIRCUIT_READ = 5.0


def _domain(payload: Mapping[str, Any]) -> str | None:
    """The first recipient's domain: enough to tell where a send went, not to whom."""
    to = payload.get("to") or []
    first = to[0] if to else None
    # type() before isinstance(): an ABC check costs more than the rest of this, once a send.
    address = str(first.get("email") or "") if type(first) is dict or isinstance(first, Mapping) else str(first or "")
    return address.rsplit("@", 1)[1].rstrip(">").lower() if "@" in address else None


class PollOnly:
    async def wait(self, timeout: float) -> bool:
        await asyncio.sleep(timeout)
        return False

    async def close(self) -> None:
        return None


def new_owner() -> str:
    """Unique per process: a restarted worker never mistakes an old lease for its own."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _RescueAfterOrphans:
    """This worker's rescuer pass, which first hands back the rows of its own lost claims:
    they were never sent, and past their lease the rescuer would make them ``unknown``.
    When that hand-back fails the pass is skipped (the next one tries again)."""

    name = "rescuer"

    def __init__(self, worker: Worker):
        self.worker = worker
        self.interval = worker.rescuer.interval

    async def run_once(self) -> Any:
        await self.worker._release_lost_claims()
        return await self.worker.rescuer.run_once()


@dataclass(slots=True, eq=False)
class _Held:
    step: ClaimedStep
    claimed_at: float  # monotonic
    # The send's limits (worker/deadline.py), counted from a monotonic instant taken before the
    # claim was asked for: no later than the database's start of the lease, so they end before
    # the real lease does. One object for every row of a claim.
    bounds: limits.Limits
    started: bool = False
    released: bool = False
    probe: bool = False  # the one step let through to probe its provider's open circuit
    answered: bool = False  # the adapter has answered; the outcome waits for the recorder


@dataclass
class RunStats:
    claimed: int = 0
    sent: int = 0
    released: int = 0
    fenced: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class Worker:
    def __init__(
        self,
        store: WorkerStore,
        providers: Mapping[str, Provider],
        settings: WorkerConfig,
        *,
        wakeup: Wakeup | None = None,
        owner: str | None = None,
        services: Sequence[Service] = (),
    ):
        self.store = store
        # More periodic work beside the rescuer and the reconciler (the signed callbacks,
        # worker/callbacks.py): run on the same schedule loop, never on the send path.
        self.extra_services = tuple(services)
        self.providers = dict(providers)
        self.settings = settings
        self.wakeup = wakeup or PollOnly()
        self.owner = owner or new_owner()
        self.backoff = Backoff(settings.retry_base, settings.retry_max)
        self.recorder = Recorder(store, actor=self.owner)
        self.rescuer = Rescuer(
            store,
            RescuerConfig(
                interval=settings.rescue_interval,
                lease_seconds=settings.lease_seconds,
                default_max_attempts=settings.max_attempts,
            ),
            actor=f"rescuer@{self.owner}",
        )
        # Held sends past their expiry (issue 17), on the rescuer's schedule.
        self.expirer = HoldExpirer(
            store, ExpirerConfig(interval=settings.rescue_interval), actor=f"expirer@{self.owner}"
        )
        lookups = {name: p for name, p in self.providers.items() if isinstance(p, Lookup)}
        self.reconciler = (
            Reconciler(
                store,
                lookups,
                ReconcilerConfig(
                    interval=settings.reconcile_interval,
                    rate=settings.reconcile_rate,
                    max_checks=settings.reconcile_checks,
                    # Longer than one lookup can take (a lease outlasts an adapter call) and than the pacing.
                    hold_seconds=max(settings.lease_seconds, 2 / settings.reconcile_rate),
                ),
                actor=f"reconciler@{self.owner}",
            )
            if lookups and settings.reconcile_checks
            else None
        )
        # Content retention: every worker runs one (SKIP LOCKED keeps them apart); none
        # when EVQ_KEEP_CONTENT is forever.
        self.redactor = (
            Redactor(
                store,
                RedactorConfig(keep=timedelta(seconds=settings.keep_content)),
                actor=f"redactor@{self.owner}",
            )
            if settings.keep_content is not None
            else None
        )
        # Shared per-provider rate limits and 429 pauses; inactive (no statement) without any.
        self.rates = RateGate(store, settings.rate_limit)
        # Providers' circuits as this worker knows them (worker/circuit.py), re-read from
        # the database every CIRCUIT_READ seconds, sooner when a probe is due.
        self.circuits = CircuitBook(settings.circuit())
        self._circuits_read_at = 0.0  # monotonic
        self.dedupe_windows = {
            name: p.dedupe_window for name, p in self.providers.items() if p.dedupe_window is not None
        }
        for name in self.providers:
            metrics.init_provider(name)
        self.stats = RunStats()
        self.streaks = FailureStreaks(hints=self._fix_hint)
        self._waiting: list[dict[str, Any]] = []  # what a drain left, and why (_drain_report)
        self._held: dict[int, _Held] = {}
        # Lease tokens whose adapter call has begun and whose outcome is not yet written.
        # Keyed by the held row (an identity hash: a UUID's is computed in Python, twice a send).
        self._began: dict[_Held, Any] = {}
        # Claims whose answer never arrived (claim id -> monotonic time of the claim), and
        # the ids of the claim statements of the claim now under way.
        self._lost_claims: dict[str, float] = {}
        self._lost_unchecked = False
        self._claiming: list[str] = []
        self._answered = 0  # held rows whose outcome waits for the recorder
        # The send task of each held row whose send was started: the send removes its own
        # entry when it ends (a task cancelled before it ran leaves a done one behind).
        self._tasks: dict[_Held, asyncio.Task[None]] = {}
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._signals = 0
        # Bound once: the module's lazy proxy rebuilds a logger on every call, and
        # a send logs from the hot path.
        self._log = log.bind()
        self._debug = getattr(self._log, "is_enabled_for", lambda _level: True)(logging.DEBUG)

    # -- control ------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stopping.set()
        self._slot_freed.set()

    def _on_signal(self, signum: int) -> None:
        self._signals += 1
        if self._signals == 1:
            log.info("shutdown_requested", signal=signal.Signals(signum).name, in_flight=len(self._held))
            self.request_stop()
        else:
            log.warning("shutdown_forced", in_flight=len(self._held))
            os._exit(130)

    # -- main loop ----------------------------------------------------------------

    async def run(self, *, drain: bool = False, install_signals: bool = True) -> int:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, sig)
        self.recorder.start()
        # One rescue pass before claiming: a worker restarted after a crash settles
        # what the crash left in flight before it does anything else.
        await self._run_once(self.rescuer)
        services = [
            asyncio.create_task(run_periodically(service, self._stopping, delay_first=True), name=f"evq-{service.name}")
            for service in (
                _RescueAfterOrphans(self),
                self.expirer,
                self.reconciler,
                self.redactor,
                *self.extra_services,
            )
            if service is not None
        ]
        log.info(
            "worker_started",
            owner=self.owner,
            providers=sorted(self.providers),
            concurrency=self.settings.concurrency,
            drain=drain,
        )
        try:
            await self._claim_loop(drain=drain)
            clean = await self._shutdown()
            if drain:
                # A drained run may end before a periodic pass came round: what the run
                # owes (its callbacks) gets one pass; anything it leaves stays owed in its rows.
                for extra in self.extra_services:
                    await self._run_once(extra)
        finally:
            self._stopping.set()
            await asyncio.gather(*services)
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
        log.info("worker_stopped", owner=self.owner, **self.stats.__dict__, clean=clean)
        return 0 if clean else 1

    async def _claim_loop(self, *, drain: bool) -> None:
        s = self.settings
        failures = 0
        while not self._stopping.is_set():
            # A slot is a send at the provider: it frees when the adapter answers, not
            # when the outcome is written, so sends never wait for a commit. Rows held
            # in all (their outcomes waiting in memory included) stay under twice the
            # concurrency, so a slow database slows claiming instead of piling up.
            free = min(s.concurrency - (len(self._held) - self._answered), 2 * s.concurrency - len(self._held))
            # Claiming one row per freed slot would cost a statement per row; wait
            # until a useful batch fits, unless nothing at all is running.
            if free <= 0 or (self._held and free < max(1, min(s.batch_size, s.concurrency) // 4)):
                self._slot_freed.clear()
                await self._slot_freed.wait()
                continue
            limit = min(s.batch_size, free)
            try:
                if self._lost_unchecked:
                    await self._release_lost_claims()
                claim_started = time.monotonic()
                probes = await self._circuit_pass()
                claimed = await self._claim(list(self.providers), limit)
                claimed.extend(probes)
                failures = 0
            except Exception as exc:
                failures += 1
                read_only = isinstance(exc, ReadOnlyDatabase)
                if not read_only:
                    # The claim may have committed with its answer lost (or failed in a way
                    # nobody classified): its rows, if any, were never sent; hand them back
                    # once the database answers. A read-only refusal committed nothing.
                    self._lost(self._claiming)
                self._claiming = []
                delay = reconnect_delay(failures)
                fields = dict(
                    error=getattr(exc, "message", None) or str(exc)[:300],
                    error_class=type(exc).__name__,
                    read_only=read_only,
                    retry_in=round(delay, 2),
                    note="not claiming until the database accepts writes" if read_only else None,
                )
                if isinstance(exc, DatabaseUnavailable):
                    log.warning("claim_failed", **fields)
                else:
                    log.error("claim_failed", unclassified=True, exc_info=exc, **fields)
                await self._sleep(delay)
                continue
            now = time.monotonic()
            bounds = limits.limits(claim_started, s.lease_seconds)
            if claimed and now >= bounds.send_by:
                # Answered too late to send (the claim waited for a connection while the
                # database restarted): by this worker's count of the lease no send may begin,
                # and each would be cut off before connecting, an attempt spent and the
                # provider blamed. No adapter has seen these rows: hand them back as a lost
                # claim's (uncounted, before the next claim), and claim again.
                self._lost(self._claiming)
                self._claiming = []
                log.warning("claim_answered_late", rows=len(claimed), waited=round(now - claim_started, 2))
                continue
            # Every row of these claims is held now: none of them is an orphan.
            self._claiming = []
            # A stop asked while the claim ran: these rows go back unsent (the shutdown
            # releases every held row whose send has not begun).
            start = not self._stopping.is_set()
            probe_ids = {p.id for p in probes}
            held_rows = self._held
            tasks = self._tasks
            create_task = asyncio.create_task
            for step in claimed:
                held = held_rows[step.id] = _Held(step, now, bounds, probe=step.id in probe_ids)
                if start:
                    # Unnamed: naming a task costs a share of a send (the step's identity
                    # is in every log line of the send instead). The send takes itself out
                    # of _tasks when it ends (no done callback: one more loop turn a send).
                    tasks[held] = create_task(self._send(held))
            self.stats.claimed += len(claimed)
            if len(claimed) == limit:
                await asyncio.sleep(0)  # let the new sends start before claiming more
                continue
            if drain and not claimed and not self._held:
                try:
                    # Hand back every lost claim this worker still knows of before asking
                    # whether work is left, whatever the "check for orphans" flag says: a
                    # rescuer pass may have cleared it with its own hand-back not yet
                    # committed (the rows then still in flight, unclaimable), and a drain that
                    # ended on that answer left them pending, unsent. Whichever of two
                    # hand-backs of the same rows commits first, the other waits for its row
                    # locks and finds nothing, so once this one returns the rows are pending
                    # and the question below sees them.
                    if await self._release_lost_claims():
                        continue
                    if not await self.store.claimable_exists(
                        providers=list(self.providers), lease_seconds=s.lease_seconds
                    ):
                        # Drained means nothing left to do now, lookups of unknown rows included.
                        await self._run_once(self.reconciler)
                        log.info("drained", **self.stats.__dict__)
                        for streak in self.streaks.ongoing():
                            if streak.warned:
                                continue  # once per streak; the drain's summary repeats it
                            # Too short a streak to have been said yet: a drain ends here.
                            streak.warned = True
                            log.warning("sends_failing", message=streaks.message(streak), **streak.fields())
                        await self._drain_report()
                        return
                except Exception as exc:
                    log.warning(
                        "drain_check_failed",
                        error_class=type(exc).__name__,
                        error=getattr(exc, "message", None) or str(exc)[:300],
                    )
                    await self._sleep(reconnect_delay(1))
                    continue
                if not self.rates.held_back:
                    continue
            # The poll interval is the period between claims, not the pause after one,
            # so a step enqueued at any moment is claimed within one interval; a provider
            # held back by its rate limit is asked again as soon as a token may be there.
            wait = max(0.0, s.poll_interval - (time.monotonic() - claim_started))
            hint = self.rates.wait_hint() if self.rates.active else None
            if self.circuits.any_held:
                # A probe may be due before the next poll.
                probe_hint = max(0.01, self._circuits_read_at - time.monotonic())
                hint = probe_hint if hint is None else min(hint, probe_hint)
            await self._idle(wait if hint is None else min(wait, hint))

    async def _claim(self, providers: list[str], limit: int) -> list[ClaimedStep]:
        s = self.settings
        if self.circuits.any_held:
            # What this worker already knows, before the database does: sends that fail at
            # the same moment as the one that opened the circuit free their slots before its
            # write commits, and must not be refilled from the same dead provider.
            providers = [p for p in providers if self.circuits.state(p) is CircuitState.CLOSED]
            if not providers:
                return []
        kwargs = dict(owner=self.owner, lease_seconds=s.lease_seconds, dedupe_windows=self.dedupe_windows)
        if not self.rates.active:
            # The hot path without limits: exactly the one claim statement.
            return await self._claim_statement(providers=providers, limit=limit, **kwargs)
        return await self.rates.claim(self._claim_statement, providers, limit, **kwargs)

    async def _claim_statement(self, **kwargs: Any) -> list[ClaimedStep]:
        # Named before it is sent: if the answer never comes, the id still says which
        # lease tokens the claim could have given (they derive from it).
        claim_id = secrets.token_hex(16)
        self._claiming.append(claim_id)
        return await self.store.claim(claim_id=claim_id, **kwargs)

    def _lost(self, claim_ids: list[str]) -> None:
        now = time.monotonic()
        for claim_id in claim_ids:
            self._lost_claims[claim_id] = now
        if claim_ids:
            self._lost_unchecked = True

    async def _release_lost_claims(self) -> int:
        """Hand back the rows of claims whose answer was lost; never a row whose send began.
        Returns how many rows this call handed back."""
        if not self._lost_claims:
            return 0
        claims = list(self._lost_claims)
        keep = {h.step.lease_token for h in self._held.values()} | set(self._began.values())
        # Cleared before the wait, not after: a claim lost while this pass waits (the claim
        # loop runs meanwhile) sets it again, and the loop must still hand that one back
        # before it claims again (cleared after, a drain found nothing claimable and ended
        # with that claim's rows in flight, then handed back unsent at the stop).
        self._lost_unchecked = False
        try:
            released = await self.store.release_orphans(owner=self.owner, held=list(keep), claims=claims)
        except BaseException:
            self._lost_unchecked = True
            raise
        if released:
            self.stats.released += released
            log.warning("orphan_claims_released", count=released, claims=len(claims))
        # A claim statement can still commit after its client gave up on it: its ids are
        # asked about again at each rescuer pass until its lease has surely ended.
        horizon = time.monotonic() - 2 * self.settings.lease_seconds
        for claim_id in claims:
            if self._lost_claims.get(claim_id, horizon) <= horizon:
                self._lost_claims.pop(claim_id, None)
        return released

    # -- provider circuits (worker/circuit.py) ---------------------------------------

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

    async def _run_once(self, service: Service | None) -> None:
        if service is None:
            return
        try:
            counts = await service.run_once()
        except DatabaseUnavailable as exc:
            log.warning(f"{service.name}_db_unavailable", error=exc.message)
            return
        except Exception:
            # A failed pass is retried by the next one; it must not stop the worker.
            log.exception(f"{service.name}_failed")
            return
        if counts.total:
            log.info(f"{service.name}_pass", **{name: getattr(counts, name) for name in counts.__slots__})

    async def _idle(self, timeout: float) -> None:
        """Wait for a notification, a freed slot, a stop, or the poll interval."""
        self._slot_freed.clear()
        waiters = [
            asyncio.create_task(self.wakeup.wait(timeout)),
            asyncio.create_task(self._stopping.wait()),
        ]
        if self._held:
            waiters.append(asyncio.create_task(self._slot_freed.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
        except TimeoutError:
            pass

    # -- one send -----------------------------------------------------------------

    async def _send(self, held: _Held) -> None:
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

    def _fix_hint(self, provider: str, cause: str) -> str | None:
        hint = getattr(self.providers.get(provider), "fix_hint", None)
        return hint(cause) if callable(hint) else None

    def summary(self) -> dict[str, Any]:
        """What this run did, for `evq worker run --drain`'s output: its counts, the
        providers whose sends are failing now, whether every attempt failed (a drain
        that reached no provider at all because of that is no success), and what the drain
        left waiting and why (``waiting``; ``circuit_held``: due steps an open circuit holds)."""
        return {
            **self.stats.__dict__,
            "outcomes": dict(self.stats.outcomes),
            "failing": [s.fields() for s in self.streaks.ongoing()],
            "all_failed": self.streaks.all_failed,
            "waiting": self._waiting,
            # Due steps left unsent because their provider's circuit is not closed.
            "circuit_held": sum(w["due"] for w in self._waiting if w["circuit"] is not None),
        }

    async def _hand_back_lost_claims(self, until: float) -> None:
        """A stop asked while a claim's answer was lost (the database went away, often the
        very reason for the restart): those rows were never sent. Hand them back while the
        grace lasts, as the database may be coming back; a worker started later does not
        know their claim ids, and its rescuer would make them ``unknown``."""
        failures = 0
        while self._lost_claims:
            left = until - time.monotonic()
            try:
                await asyncio.wait_for(self._release_lost_claims(), timeout=max(0.1, left))
                return
            except Exception as exc:
                failures += 1
                left = until - time.monotonic()
                if left <= 0:
                    log.warning(
                        "lost_claims_not_released",
                        claims=len(self._lost_claims),
                        error_class=type(exc).__name__,
                        error=getattr(exc, "message", None) or str(exc)[:300],
                        note="never sent; past their lease the rescuer makes them unknown",
                    )
                    return
                await asyncio.sleep(min(left, reconnect_delay(failures)))

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

    # -- shutdown -------------------------------------------------------------------

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


def _iso(at: datetime | None) -> str | None:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z") if at is not None else None
