"""Closing many unknown rows: a preview of exactly the rows and their count, then the close of exactly those rows."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app.service import Selection
from evq.ops.web.page.common import BULK_MAX, filters_of, posted, query_string, refusal, render, resolve, router
from evq.worker.errors import AuthFailed, InvalidRequest
from evq.worker.states import Status


@router.post("/unknown/preview", response_class=HTMLResponse)
async def bulk_preview(request: Request) -> HTMLResponse:
    session, values = await posted(request)
    filters = filters_of(values)
    page = {"filters": filters, "posted": values, "query": query_string(filters), "bulk_max": BULK_MAX}
    try:
        selection = Selection(statuses=(str(Status.UNKNOWN),), filters=filters, limit=BULK_MAX)
        reply = await resolve(request, session, values, selection, dry_run=True)
    except (InvalidRequest, AuthFailed) as exc:
        status, shown = refusal(exc)
        return render(request, "preview.html", session, status=status, error=shown, rows=[], **page)
    return render(
        request,
        "preview.html",
        session,
        rows=reply.data["steps"],
        verdict=reply.data["verdict"],
        to_status=reply.data["to_status"],
        **page,
    )


@router.post("/unknown/close", response_class=HTMLResponse)
async def bulk_close(request: Request) -> HTMLResponse:
    session, values = await posted(request)
    filters = filters_of(values)
    try:
        ids = tuple(int(i) for i in values.get("ids", "").split(",") if i.strip())
        if not ids or len(ids) > BULK_MAX:
            raise ValueError
    except ValueError:
        raise InvalidRequest([{"field": "ids", "message": f"1 to {BULK_MAX} step ids from a preview"}]) from None
    try:
        reply = await resolve(request, session, values, Selection(statuses=(str(Status.UNKNOWN),), ids=ids))
    except (InvalidRequest, AuthFailed) as exc:
        status, shown = refusal(exc)
        return render(
            request,
            "preview.html",
            session,
            status=status,
            error=shown,
            filters=filters,
            rows=[],
            posted=values,
            query=query_string(filters),
            bulk_max=BULK_MAX,
        )
    return render(request, "closed.html", session, d=reply.data, filters=filters, query=query_string(filters))
