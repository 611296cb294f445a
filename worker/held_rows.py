"""The worker's held-rows bookkeeping: what one claimed row carries while this worker
holds it, and the hand-back of rows of claims whose answer was lost.

Invariant 8 here: every row handed back is one whose send never began. Their lease
tokens derive from the claim id, so the worker names exactly those claims, and
``_release_lost_claims`` keeps back every token still held or in ``_began``.

``HeldRows`` is a mixin of ``Worker`` (worker/runner.py), split out of it by what it
does: its methods are the worker's own, reached as ``self.<name>`` with no call
between, and the attributes named below are set by ``Worker.__init__``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from evq.worker import deadline as limits
from evq.worker.backoff import reconnect_delay
from evq.worker.config import WorkerConfig
from evq.worker.logs import get_logger
from evq.worker.ports import WorkerStore
from evq.worker.records import ClaimedStep

if TYPE_CHECKING:
    from evq.worker.runner import RunStats

# The worker's logger name, as before the split: every line keeps its logger.
log = get_logger("worker")


@dataclass(slots=True, eq=False)
class Held:
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


class HeldRows:
    # Set by Worker.__init__ (annotations only: no class attribute, nothing at run time).
    store: WorkerStore
    settings: WorkerConfig
    owner: str
    stats: RunStats
    _held: dict[int, Held]
    _began: dict[Held, Any]
    _lost_claims: dict[str, float]
    _lost_unchecked: bool

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
