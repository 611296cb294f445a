"""The overview: queue counts, the oldest unknown row, held sends, providers and their circuits,
the latest refused enqueues, and the pictures (ops/web/charts.py) of the last 1, 6 or 24 hours:
is a provider down, and is the queue better or worse?"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime, tzinfo
from typing import Any

import anyio.to_thread
from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app import service
from evq.ops.web import charts
from evq.ops.web.page.common import (
    OVERVIEW_REFUSALS,
    app_state,
    caller_of,
    concurrently,
    render,
    router,
    signed_in,
    zone_of,
)
from evq.worker.errors import EvqError
from evq.worker.states import Status
from evq.worker.window import DEFAULT_HOURS, WINDOWS, bounds, bucket_seconds


@router.get("", response_class=HTMLResponse)
async def overview(request: Request, hours: int = DEFAULT_HOURS) -> HTMLResponse:
    session = await signed_in(request)
    # Only the three windows whose buckets the charts know: anything else is refused, not rounded.
    bucket = bucket_seconds(hours)
    state = app_state(request)
    who = caller_of(session)
    timer = request.state.timer
    now = datetime.now(UTC)
    # Every read at once (each its own connection of the store's pool, the queue counts the
    # collector's own on a thread): the page waits for the slowest, not for their sum.
    with timer.part("read"):
        (stats, stats_error), oldest, circuits, refusals, waiting, *reads = await concurrently(
            queue_figures(state),
            service.list_steps(
                state.store, who, statuses=[str(Status.UNKNOWN)], limit=1, unresolvable=state.policy.unresolvable
            ),
            # Every provider: what settles a lost answer, its rate limit, and whether evq has
            # stopped sending to it and why (worker/circuit.py).
            service.list_providers(state.store, who, state.settings),
            # What agents tried lately and were refused (worker/refusals.py), newest first.
            service.list_refusals(state.store, who, limit=OVERVIEW_REFUSALS),
            # The approval queue: how many sends wait for a person, and the oldest of them.
            service.list_steps(state.store, who, statuses=[str(Status.HELD)], limit=1),
            *chart_reads(state.store, hours, now),
        )
    with timer.part("draw"):
        figures = pictures(reads, hours, bucket, now, circuits.data, zone_of(request, session))
        return render(
            request,
            "overview.html",
            session,
            stats=stats,
            stats_error=stats_error,
            statuses=list(Status),
            oldest=oldest.data[0] if oldest.data else None,
            held=[c for c in circuits.data if not c["sending"]],
            providers=circuits.data,
            refusals=refusals.data,
            held_total=waiting.meta["total"],
            held_oldest=waiting.data[0] if waiting.data else None,
            hours=hours,
            windows=sorted(WINDOWS),
            window_words=charts.window_words(hours),
            **figures,
        )


async def queue_figures(state: Any) -> tuple[Any, EvqError | None]:
    """The queue counts (the collector's query, on a thread: its reader is synchronous), or
    why not: the page is drawn without them rather than not at all."""
    try:
        return await anyio.to_thread.run_sync(state.read_stats), None
    except EvqError as exc:
        return None, exc


def chart_reads(store: Any, hours: int, now: datetime) -> list[Awaitable[Any]]:
    """The charts' reads of the window ending ``now``, in the order :func:`pictures` takes them;
    each covers the window through the evidence's BRIN index, the rollups or a small index of
    its own (adapters/postgres/queries.sql, chart_*)."""
    return [
        store.chart_sends(hours, now=now),
        store.chart_queue_samples(hours, now=now),
        store.chart_providers(hours, now=now),
        store.chart_unknown_ages(now=now),
    ]


def pictures(
    reads: list[Any], hours: int, bucket: int, now: datetime, providers: list[dict[str, Any]], tz: tzinfo
) -> dict[str, Any]:
    """The charts drawn from :func:`chart_reads`' answers."""
    sent, samples, per_provider, unknown_ages = reads
    # Axis times in the operator's zone (zone.py: the session's choice, else EVQ_OPS_TIMEZONE).
    since, until = bounds(hours, now)
    sends = charts.sends_series(sent, since=since, until=until, bucket=bucket)
    rows = {r["provider"]: r for r in per_provider}
    line = {"hours": hours, "since": since, "until": until, "tz": tz}
    by_provider = {}
    for p in providers:
        row = rows.get(p["provider"])
        if row is not None:
            by_provider[p["provider"]] = {
                "row": row,
                "bar": charts.provider_chart(row, hours=hours),
                "summary": charts.provider_summary(row, hours),
            }
    return {
        "sends_chart": charts.sends_chart(sends, hours=hours, bucket=bucket, since=since, until=until, tz=tz),
        "unknown_chart": charts.unknown_chart(unknown_ages),
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
