"""The reconciler: asks providers that can look messages up about ``unknown`` rows.

An ``unknown`` row is a send that may or may not have reached the provider. A
provider with a lookup (the HTTP adapter: by the tag carrying our key) can settle
it: if it has the message, the row is closed as ``accepted`` with the provider's id
and the lookup as evidence. If it says it has none, that is kept as evidence and
shown to operators, but the row stays ``unknown``: absence is not proof (the
provider may not have indexed it yet, or may not keep it searchable). It is asked
again later, with growing pauses, up to ``max_checks`` times; then only an operator
closes it.

Safe with many workers: a row is claimed for one lookup by moving its
``reconcile_after`` forward (SKIP LOCKED, no lock held while the provider answers),
and the closing statement re-checks that the row is still ``unknown``. Rate-limited:
at most ``rate`` lookups per second per worker, and a pass does at most what the
rate allows in one interval.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from evq.worker import metrics
from evq.worker.errors import ConfigError
from evq.worker.logs import get_logger
from evq.worker.ports import Lookup, LookupFailed, LookupResult, ReconcileStore, profile_of
from evq.worker.records import ReconcileCounts, UnknownStep
from evq.worker.secret_scrub import scrub_record

log = get_logger("evq.reconciler")


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    interval: float = 30.0
    rate: float = 2.0  # most lookups per second
    max_checks: int = 5  # lookups per row before it is left to an operator
    # How long a claimed row is skipped by other reconcilers: longer than one lookup can take.
    hold_seconds: float = 120.0
    batch: int | None = None  # most lookups per pass; None: what the rate allows in one interval

    def validate(self) -> ReconcilerConfig:
        if (
            self.interval <= 0
            or self.rate <= 0
            or self.max_checks < 1
            or self.hold_seconds <= 1 / self.rate
            or (self.batch is not None and self.batch < 1)
        ):
            raise ConfigError(f"invalid reconciler config: {self}")
        return self

    @property
    def per_pass(self) -> int:
        return self.batch or max(1, math.ceil(self.rate * self.interval))

    def next_check(self, checks: int) -> float:
        """Pause before the next lookup of a row the provider has said nothing about ``checks`` times."""
        return self.interval * 2.0 ** max(0, checks - 1)


class Reconciler:
    name = "reconciler"

    def __init__(
        self,
        store: ReconcileStore,
        lookups: Mapping[str, Lookup],
        config: ReconcilerConfig,
        *,
        actor: str = "reconciler",
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.lookups = dict(lookups)
        self.config = config.validate()
        self.interval = config.interval
        self.actor = actor
        self._sleep = sleep
        self._clock = clock
        self._next_lookup = 0.0  # clock() time before which no lookup starts

    async def run_once(self, now: datetime | None = None) -> ReconcileCounts:
        counts: Counter[str] = Counter()
        for _ in range(self.config.per_pass):
            step = await self.store.reconcile_claim(
                providers=list(self.lookups),
                max_checks=self.config.max_checks,
                hold_seconds=self.config.hold_seconds,
                now=now,
            )
            if step is None:
                break
            # Paced after the claim, so a pass that finds nothing never waits; the hold
            # outlasts the wait (validate), so no other reconciler takes the row meanwhile.
            await self._pace()
            with structlog.contextvars.bound_contextvars(
                run_id=step.run_id, step_id=step.step_id, step=step.id, idempotency_key=step.idempotency_key
            ):
                counts[await self._reconcile(step, now)] += 1
        return ReconcileCounts(**counts)

    async def _pace(self) -> None:
        wait = self._next_lookup - self._clock()
        if wait > 0:
            await self._sleep(wait)
        self._next_lookup = max(self._next_lookup, self._clock()) + 1.0 / self.config.rate

    async def _reconcile(self, step: UnknownStep, now: datetime | None) -> str:
        try:
            result = await asyncio.wait_for(
                self.lookups[step.provider].lookup(step.idempotency_key, step.message_id),
                timeout=self.config.hold_seconds / 2,
            )
        except (LookupFailed, TimeoutError) as exc:
            metrics.RECONCILED.labels(result="error").inc()
            log.warning("reconcile_lookup_failed", provider=step.provider, error=str(exc) or type(exc).__name__)
            return "failed"
        except Exception:
            # A bug in one adapter's lookup must not stop the pass; the row is asked again after its hold.
            metrics.RECONCILED.labels(result="error").inc()
            log.exception("reconcile_lookup_raised", provider=step.provider)
            return "failed"
        # The provider's answer is kept as evidence: scrubbed like every provider text.
        result = scrub_record(result)
        if result.found:
            return await self._found(step, result, now)
        return await self._absent(step, result, now)

    def _by(self, step: UnknownStep) -> str:
        """What the provider's lookup searched by, in words (its profile's ``lookup_by``)."""
        by = profile_of(self.lookups[step.provider]).lookup_by
        return "Message-ID" if by == ("message_id",) else "key"

    async def _found(self, step: UnknownStep, result: LookupResult, now: datetime | None) -> str:
        metrics.RECONCILED.labels(result="accepted").inc()
        known = f" (id {result.provider_message_id})" if result.provider_message_id else ""
        message = (
            f"the {step.provider} provider has this message{known}, "
            f"found by the step's {self._by(step)}: reconciled as accepted"
        )
        closed = await self.store.reconcile_found(
            step.id,
            provider_message_id=result.provider_message_id,
            message=message,
            detail={"found": True, "provider": step.provider, "answer": result.raw, "message": message},
            actor=self.actor,
            now=now,
        )
        log.info("reconciled", provider_message_id=result.provider_message_id, closed=closed)
        return "accepted" if closed else "lost"

    async def _absent(self, step: UnknownStep, result: LookupResult, now: datetime | None) -> str:
        metrics.RECONCILED.labels(result="not_found").inc()
        check = step.reconcile_checks + 1
        delay = self.config.next_check(check)
        later = (
            "no more automatic lookups: an operator decides"
            if check >= self.config.max_checks
            else f"asked again in {delay:g}s"
        )
        message = (
            f"the {step.provider} provider has no message with this step's {self._by(step)} (lookup {check} of "
            f"{self.config.max_checks}); absence is not proof, so the step stays unknown; {later}"
        )
        recorded = await self.store.reconcile_absent(
            step.id,
            next_check=delay,
            detail={
                "found": False,
                "provider": step.provider,
                "answer": result.raw,
                "check": check,
                "max_checks": self.config.max_checks,
                "message": message,
            },
            actor=self.actor,
            now=now,
        )
        log.info("reconcile_absent", check=check, recorded=recorded)
        return "absent" if recorded else "lost"
