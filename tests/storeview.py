"""Reading a store back through its Python protocol only (list_steps, get_steps, circuits), never
its tables: the core's tests assert on what any store answers, so they hold whatever the schema."""

from __future__ import annotations

import collections
from typing import Any

from evq.worker.ports import StepFilter


async def steps(store: Any) -> list[dict[str, Any]]:
    """Every step row, by id."""
    summaries, _ = await store.list_steps(StepFilter(limit=None))
    details = await store.get_steps([s.id for s in summaries])
    return sorted((d.step for d in details), key=lambda s: s["id"])


async def step(store: Any, step_id: int) -> dict[str, Any]:
    return (await store.get_step(step_id)).step


async def statuses(store: Any) -> collections.Counter[str]:
    return collections.Counter(str(s["status"]) for s in await steps(store))


async def evidence(store: Any, step_id: int | None = None) -> list[dict[str, Any]]:
    """One step's evidence rows, or every step's, in the order they were written (by id)."""
    if step_id is not None:
        rows = (await store.get_step(step_id)).evidence
    else:
        summaries, _ = await store.list_steps(StepFilter(limit=None))
        rows = [e for d in await store.get_steps([s.id for s in summaries]) for e in d.evidence]
    return sorted(rows, key=lambda e: e["id"])


async def kinds(store: Any, step_id: int | None = None) -> list[str]:
    return [e["kind"] for e in await evidence(store, step_id)]


async def circuit(store: Any, provider: str) -> dict[str, Any] | None:
    return next((c for c in await store.circuits() if c["provider"] == provider), None)
