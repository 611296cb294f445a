"""The overview: queue counts, the oldest unknown row, held sends, providers and their circuits, the latest refused enqueues."""

from __future__ import annotations

import anyio.to_thread
from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app import service
from evq.ops.web.page.common import OVERVIEW_REFUSALS, app_state, caller_of, render, router, signed_in
from evq.worker.errors import EvqError
from evq.worker.states import Status


@router.get("", response_class=HTMLResponse)
async def overview(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    state = app_state(request)
    stats, stats_error = None, None
    try:
        stats = await anyio.to_thread.run_sync(state.read_stats)
    except EvqError as exc:
        stats_error = exc
    who = caller_of(session)
    oldest = await service.list_steps(
        state.store, who, statuses=[str(Status.UNKNOWN)], limit=1, unresolvable=state.policy.unresolvable
    )
    # Every provider: what settles a lost answer, its rate limit, and whether evq has stopped
    # sending to it and why (worker/circuit.py).
    circuits = await service.list_providers(state.store, who, state.settings)
    held = [c for c in circuits.data if not c["sending"]]
    # What agents tried lately and were refused (worker/refusals.py), newest first.
    refusals = await service.list_refusals(state.store, who, limit=OVERVIEW_REFUSALS)
    # The approval queue: how many sends wait for a person, and the oldest of them.
    waiting = await service.list_steps(state.store, who, statuses=[str(Status.HELD)], limit=1)
    return render(
        request,
        "overview.html",
        session,
        stats=stats,
        stats_error=stats_error,
        statuses=list(Status),
        oldest=oldest.data[0] if oldest.data else None,
        held=held,
        providers=circuits.data,
        refusals=refusals.data,
        held_total=waiting.meta["total"],
        held_oldest=waiting.data[0] if waiting.data else None,
    )
