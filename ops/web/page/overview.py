"""The overview: queue counts, the oldest unknown row, held sends, providers and their circuits,
the latest refused enqueues, and the pictures (ops/web/charts.py) of the last 1, 6 or 24 hours:
is a provider down, and is the queue better or worse?"""

from __future__ import annotations

from datetime import UTC, datetime, tzinfo
from typing import Any

import anyio.to_thread
from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app import service
from evq.ops.web import charts
from evq.ops.web.page.common import OVERVIEW_REFUSALS, app_state, caller_of, render, router, signed_in
from evq.worker.errors import EvqError
from evq.worker.states import Status
from evq.worker.window import DEFAULT_HOURS, WINDOWS, bounds, bucket_seconds


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, hours: int = DEFAULT_HOURS) -> HTMLResponse:
    session = await signed_in(request)
    # Only the three windows whose buckets the charts know: anything else is refused, not rounded.
    bucket = bucket_seconds(hours)
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
    figures = await pictures(state.store, hours, bucket, circuits.data)
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
        hours=hours,
        windows=sorted(WINDOWS),
        window_words=charts.window_words(hours),
        **figures,
    )


async def pictures(store: Any, hours: int, bucket: int, providers: list[dict[str, Any]]) -> dict[str, Any]:
    """The charts of the window ending now; each read covers the window through the evidence's
    BRIN index or a small index of its own (adapters/postgres/queries.sql, chart_*)."""
    # The operator's zone when the page knows one; UTC until then.
    tz: tzinfo = UTC
    now = datetime.now(UTC)
    since, until = bounds(hours, now)
    sends = charts.sends_series(await store.chart_sends(hours, now=now), since=since, until=until, bucket=bucket)
    samples = await store.chart_queue_samples(hours, now=now)
    rows = {r["provider"]: r for r in await store.chart_providers(hours, now=now)}
    line = {"hours": hours, "since": since, "until": until, "tz": tz}
    by_provider = {}
    for p in providers:
        row = rows.get(p["provider"])
        if row is not None:
            by_provider[p["provider"]] = {
                "row": row,
                "bar": charts.provider_chart(row, hours=hours),
                "summary": charts.provider_summary(row, hours),
                "failing": charts.failing(row, hours),
            }
    return {
        "sends_chart": charts.sends_chart(sends, hours=hours, bucket=bucket, since=since, until=until, tz=tz),
        "unknown_chart": charts.unknown_chart(await store.chart_unknown_ages(now=now)),
        "lag_chart": charts.line_chart(
            "chart-lag",
            "Queue lag",
            samples,
            "lag_seconds",
            seconds=True,
            caption="How long the oldest row claimable at each minute had waited since it became due "
            "(queue_samples, written once a minute by each running worker and evq serve). "
            "A break in the line is a minute nobody sampled, not a zero.",
            **line,
        ),
        "unknown_line": charts.line_chart(
            "chart-unknown-count",
            "Unknown rows",
            samples,
            "unknown",
            caption="How many rows were unknown at each minute (queue_samples). "
            "A break in the line is a minute nobody sampled, not a zero.",
            **line,
        ),
        "provider_figures": by_provider,
        "providers_table": charts.providers_table(list(rows.values()), hours),
        "legend": charts.legend(),
    }
