"""Signing in and out with an API key: a fresh session (and CSRF token) at sign-in; sign-out ends every copy of the session on the server."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from evq.ops.web import api
from evq.ops.web.page.common import ENDED, SOURCE, app_state, form, render, router, set_cookie, visitor_session
from evq.ops.web.protocol import TooManyFailures
from evq.worker.errors import AuthFailed
from evq.worker.keys import Permission, authenticate


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> HTMLResponse:
    session, _ = visitor_session(request)
    notice = ENDED.get(request.query_params.get("ended") or "")
    return render(request, "login.html", session, notice=notice)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    session, _ = visitor_session(request)
    values = await form(request, session)
    key = values.get("key", "").strip()
    state = app_state(request)
    try:
        identity = await api.checked(
            state, api.client_address(request), lambda: authenticate(state.store, key, Permission.READ, source=SOURCE)
        )
    except TooManyFailures as exc:
        refused = render(request, "login.html", session, status=429, error=exc)
        refused.headers["Retry-After"] = str(exc.retry_after)
        return refused
    except AuthFailed as exc:
        return render(request, "login.html", session, status=401, error=exc)
    row = await state.store.key_by_id(identity.key_id)
    if row is None:  # revoked and gone between the two reads: not signed in
        return render(request, "login.html", session, status=401, error=AuthFailed("the API key is not valid"))
    response = RedirectResponse("/ops", status_code=303)
    # A new session (and CSRF token) at sign-in: nothing set before it carries over. It keeps the
    # key's id only; each request builds the identity again from the key's row (common.signed_in).
    fresh = state.sessions.new(identity=identity, generation=row["session_generation"])
    set_cookie(request, response, fresh)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    session, _ = visitor_session(request)
    await form(request, session)
    if session.key_id is not None and session.generation is not None:
        # On the server, not only in this browser: this cookie (and any copy) is refused from now on.
        await app_state(request).store.end_sessions(session.key_id, session.generation)
    response = RedirectResponse("/ops/login", status_code=303)
    set_cookie(request, response, app_state(request).sessions.new())
    return response
