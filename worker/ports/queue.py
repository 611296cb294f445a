"""The queue's side of the store: claim, record, hand back, rescue (worker/runner.py,
worker/outcome_writer.py, worker/rescuer.py).

Every transition is guarded by the state (and lease) it expects; see
adapters/postgres/queries.sql.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from evq.worker.records import ClaimedStep, RecordResult, RescueCounts, Transition


class ClaimStore(Protocol):
    """The claim loop's statements: what commits an attempt, and what hands back rows never sent."""

    async def claim(
        self,
        *,
        owner: str,
        providers: Sequence[str],
        limit: int,
        lease_seconds: float,
        dedupe_windows: Mapping[str, float],
        claim_id: str | None = None,
        probe: bool = False,
        now: datetime | None = None,
    ) -> list[ClaimedStep]:
        """``probe``: the caller holds the probe of these providers' circuits (worker/circuit.py),
        so their steps are claimed although the circuit is not closed."""
        ...

    async def release(self, steps: Sequence[ClaimedStep], *, actor: str, now: datetime | None = None) -> int: ...

    async def release_orphans(
        self, *, owner: str, held: Sequence[Any], claims: Sequence[str], now: datetime | None = None
    ) -> int: ...

    async def claimable_exists(
        self, *, providers: Sequence[str], lease_seconds: float, now: datetime | None = None
    ) -> bool: ...

    async def waiting(self, *, providers: Sequence[str], now: datetime | None = None) -> list[dict[str, Any]]:
        """What a drain leaves: per provider with any, ``due`` (pending or retryable whose time
        has come), ``later`` (not yet: send_at or backoff) with the earliest ``next_at``, and
        ``held`` (waiting for approval); providers with none are left out, ordered by name."""
        ...


class RecordStore(Protocol):
    """The recorder's group commit: each transition fenced by its lease token."""

    async def record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]: ...


class RescueStore(Protocol):
    """Rows in flight past their lease become unknown (or retryable, within a dedupe window)."""

    async def rescue(
        self, *, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None = None
    ) -> RescueCounts: ...
