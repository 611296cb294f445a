"""The time zone the page shows exact times in, chosen per session: a form at /ops/zone whose
choice is kept in the signed session cookie (the server's default is EVQ_OPS_TIMEZONE)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from evq.ops.time_zones import time_zone, zone_names
from evq.ops.web.page.common import app_state, posted, render, router, set_cookie, signed_in, zone_of
from evq.ops.web.session import Session
from evq.worker.errors import InvalidRequest

# The system's IANA names, listed once: a <datalist> suggests them, the POST accepts only a known one.
ZONES = sorted(z for z in zone_names() if "/" in z or z == "UTC")


@router.get("/zone", response_class=HTMLResponse)
async def zone_page(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    saved = "Saved: the page shows times in this zone." if request.query_params.get("saved") else None
    return _page(request, session, done=saved)


def _page(request: Request, session: Session, status: int = 200, **context: Any) -> HTMLResponse:
    return render(
        request,
        "zone.html",
        session,
        status=status,
        zones=ZONES,
        current=zone_of(request, session).key,
        default=app_state(request).settings.ops_timezone,
        now=datetime.now(UTC),
        **context,
    )


@router.post("/zone", response_class=HTMLResponse)
async def choose_zone(request: Request) -> Response:
    session, values = await posted(request)
    asked = (values.get("tz") or "").strip()
    try:
        chosen = time_zone(asked)
    except ValueError as exc:
        refused = InvalidRequest([{"field": "tz", "message": str(exc)}])
        return _page(request, session, status=422, error=refused, asked=asked)
    response = RedirectResponse("/ops/zone?saved=1", status_code=303)
    # None: back to the server's default, so a later change of EVQ_OPS_TIMEZONE applies again.
    kept = None if chosen == app_state(request).settings.ops_timezone else chosen
    set_cookie(request, response, replace(session, tz=kept))
    return response
