"""The core's ports. Adapters implement them; the core never imports an adapter.

Both the PostgreSQL store and the in-memory fake satisfy :class:`Store`; the
conformance suite (tests/conformance) runs one set of tests against both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from evq.worker.outcomes import Outcome
from evq.worker.records import (
    ClaimedStep,
    EnqueueResult,
    RecordResult,
    RescueCounts,
    Resolved,
    RunDetail,
    StepDetail,
    StepSummary,
    Transition,
)
from evq.worker.request import ValidRequest
from evq.worker.resolution import Resolution
from evq.worker.states import Status


@dataclass(frozen=True, slots=True)
class StepFilter:
    ids: tuple[int, ...] = ()
    statuses: tuple[Status, ...] = ()
    run_id: str | None = None
    provider: str | None = None
    created_before: datetime | None = None
    recipient_domain: str | None = None
    limit: int | None = 50  # None: every matching row
    offset: int = 0


@runtime_checkable
class Store(Protocol):
    """Every transition is guarded by the state (and lease) it expects; see queries.sql."""

    async def enqueue(self, request: ValidRequest, *, now: datetime | None = None) -> EnqueueResult: ...

    async def enqueue_many(self, requests: Sequence[ValidRequest]) -> list[EnqueueResult]: ...

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

    async def record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]: ...

    async def release(self, steps: Sequence[ClaimedStep], *, actor: str, now: datetime | None = None) -> int: ...

    async def release_orphans(
        self, *, owner: str, held: Sequence[Any], claims: Sequence[str], now: datetime | None = None
    ) -> int: ...

    async def rescue(
        self, *, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None = None
    ) -> RescueCounts: ...

    async def claimable_exists(
        self, *, providers: Sequence[str], lease_seconds: float, now: datetime | None = None
    ) -> bool: ...

    # Provider circuits (worker/circuit.py); each change writes its event row with it.
    async def circuit_trip(
        self,
        *,
        provider: str,
        reason: str,
        detail: str,
        actor: str,
        probe_base: float,
        probe_max: float,
        now: datetime | None = None,
    ) -> dict[str, Any] | None: ...

    async def circuit_close(
        self, *, provider: str, reason: str, detail: str, actor: str, now: datetime | None = None
    ) -> bool: ...

    async def circuit_probe_take(
        self, *, provider: str, owner: str, hold_seconds: float, lease_seconds: float, now: datetime | None = None
    ) -> bool: ...

    async def circuit_probe_idle(
        self, *, provider: str, owner: str, probe_base: float, detail: str = ..., now: datetime | None = None
    ) -> bool: ...

    async def circuits(self, *, now: datetime | None = None) -> list[dict[str, Any]]: ...

    async def get_step(self, step_id: int) -> StepDetail: ...

    async def list_steps(self, where: StepFilter, *, now: datetime | None = None) -> tuple[list[StepSummary], int]: ...

    async def get_run(self, run_id: str) -> RunDetail: ...

    async def resolve(
        self,
        step_id: int,
        resolution: Resolution,
        *,
        actor: str,
        default_max_attempts: int,
        now: datetime | None = None,
    ) -> Resolved: ...


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Everything an adapter may use for one attempt. Key and Message-ID never change."""

    step_id: int
    run_id: str
    idempotency_key: str
    message_id: str
    attempt: int
    payload: Mapping[str, Any]
    # Monotonic instants (worker/deadline.py): the whole exchange ends by ``deadline``;
    # the irreversible step (SMTP's final ".", writing the HTTP request) never begins
    # after ``send_by``. None: no limit beyond the adapter's own timeouts.
    deadline: float | None = None
    send_by: float | None = None


@runtime_checkable
class Provider(Protocol):
    """An email provider adapter: one request in, exactly one outcome out."""

    name: str
    # How long the provider honours our idempotency key, in seconds; None when it does not.
    dedupe_window: float | None

    async def send(self, request: SendRequest) -> Outcome: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LookupResult:
    """What the provider said when asked for the message a step may have sent."""

    found: bool
    provider_message_id: str | None = None
    # The provider's answer, trimmed and free of secrets: kept as evidence either way.
    raw: dict[str, Any] = field(default_factory=dict)


class LookupFailed(Exception):
    """The provider could not be asked (network, 5xx, an unreadable answer): no answer at all."""


@runtime_checkable
class Lookup(Protocol):
    """An optional capability of a Provider: find a message by our idempotency key or
    Message-ID. The reconciler settles ``unknown`` rows of providers that have it.

    ``found=False`` is the provider's word that it has no such message; the reconciler
    keeps that as evidence but never takes it as proof the message was not sent.
    """

    async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult: ...
