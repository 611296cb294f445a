"""What the conformance tests share: a fixed clock, and reading rows back through the port only,
so an assertion holds whatever the schema."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from evq.worker.backoff import Backoff
from evq.worker.outcomes import Outcome
from evq.worker.records import ClaimedStep, Transition
from evq.worker.transitions import decide

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = 60.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def claim(
    store: Any,
    *,
    now: datetime = T0,
    owner: str = "w1",
    limit: int = 10,
    windows: dict[str, float] | None = None,
    claim_id: str | None = None,
    providers: tuple[str, ...] = ("smtp",),
    probe: bool = False,
) -> list[ClaimedStep]:
    return await store.claim(
        owner=owner,
        providers=list(providers),
        limit=limit,
        lease_seconds=LEASE,
        dedupe_windows=windows or {},
        claim_id=claim_id,
        probe=probe,
        now=now,
    )


def settle(step: ClaimedStep, outcome: Outcome, *, window_open: bool = False, **kw: Any) -> Transition:
    return decide(step, outcome, default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=window_open, **kw)


async def row(store: Any, step_id: int) -> dict[str, Any]:
    return (await store.get_step(step_id)).step


async def evidence(store: Any, step_id: int) -> list[dict[str, Any]]:
    return (await store.get_step(step_id)).evidence


async def kinds(store: Any, step_id: int) -> list[str]:
    return [e["kind"] for e in await evidence(store, step_id)]


async def rescue(store: Any, now: datetime, *, default_max_attempts: int = 5) -> Any:
    return await store.rescue(
        limit=100, lease_seconds=LEASE, default_max_attempts=default_max_attempts, actor="rescuer", now=now
    )
