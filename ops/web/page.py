"""The operators' page at /ops: server-rendered (Jinja2, autoescaped, no script at all).

Overview, unknown rows oldest first (filters in the URL), held sends oldest first, one
step, a run's trace, closing rows one at a time or in bulk after a preview, and approving,
denying or cancelling a send, all through ops/app/service.py and ops/app/approvals.py.
Sign in with an API key: operator and admin keys may close rows and decide on held sends;
agent keys may look (a viewer's read-only session), since reading is what every key may do
elsewhere too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from evq.ops.app import approvals, service
from evq.ops.app.age import age
from evq.ops.app.contract import to_json
from evq.ops.app.service import Caller, Selection
from evq.ops.web import api
from evq.ops.web.protocol import TooManyFailures
from evq.ops.web.session import COOKIE, Session
from evq.ops.web.state import AppState
from evq.worker.errors import AuthFailed, EvqError, Forbidden, InvalidRequest, NotFound, StateConflict
from evq.worker.keys import Permission, authenticate, split_key
from evq.worker.resolution import Resolution, Verdict
from evq.worker.states import Status

SOURCE = "the sign-in form"
ENDED = {
    "revoked": "That key was revoked: sign in with another.",
    "signed-out": "This session was signed out: sign in again.",
}
FILTER_KEYS = ("run_id", "provider", "older_than", "recipient_domain")
OVERVIEW_REFUSALS = 10  # the latest refused enqueues on the overview
PAGE_SIZE = 100
HELD_PAGE_SIZE = 25  # each held send is shown whole (its message and the decision), so fewer a page
# The steps a person may still stop before a worker claims them (docs/design.md, "Approvals and budgets").
CANCELLABLE = (str(Status.HELD), str(Status.PENDING), str(Status.RETRYABLE))
DONE = {
    "approved": "Approved: the send is pending and goes out with the same key and Message-ID.",
    "denied": "Denied: the send is rejected (reason denied) and its notify address is told.",
    "cancelled": "Cancelled: the send is rejected (reason cancelled) and will not go out.",
}
BULK_MAX = 500  # rows one bulk close may act on; a preview says when more match

_TEMPLATES = resources.files("evq.ops.web").joinpath("templates")
env = Environment(
    loader=FileSystemLoader(str(_TEMPLATES)),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
env.filters["age"] = age
env.filters["shown"] = lambda value: to_json(value) if isinstance(value, (dict, list)) else value
env.filters["domain_only"] = lambda email: "…@" + email.rpartition("@")[2] if "@" in email else "…"


def _text(value: Any) -> str:
    return to_json(value) if isinstance(value, (dict, list)) else str(value)


def hold_reasons(hold: Any) -> list[tuple[str, str]]:
    """Why a send was held, as (rule, why) pairs, from ``email_steps.hold``: a list of rules
    (``{"rule", "why", ...}``) or an object listing ``rules`` and ``budgets``. Whatever its
    shape the page shows all of it as text, so an unexpected shape still says what it holds."""
    if hold is None:
        return []
    if isinstance(hold, dict):
        listed = [*(hold.get("rules") or []), *(hold.get("budgets") or [])]
        return hold_reasons(listed) if listed else [(str(k), _text(v)) for k, v in hold.items()]
    if not isinstance(hold, list):
        return [(_text(hold), "")]
    out: list[tuple[str, str]] = []
    for item in hold:
        if isinstance(item, dict):
            others = {k: v for k, v in item.items() if k not in ("rule", "budget", "why")}
            why = item.get("why") or (to_json(others) if others else "")
            out.append((str(item.get("rule") or item.get("budget") or "?"), str(why)))
        else:
            out.append((_text(item), ""))
    return out


env.filters["hold_reasons"] = hold_reasons


def expires_in(when: Any) -> str:
    """How long a held send has until it expires (``hold_expires_at``), as the page says it."""
    if when is None:
        return "never expires"
    if isinstance(when, str):
        when = datetime.fromisoformat(when)
    left = (when - datetime.now(UTC)).total_seconds()
    return f"expires in {age(left)}" if left > 0 else "expired: the next expiry pass rejects it"


env.filters["expires_in"] = expires_in

ADDRESS_HEADERS = (("to", "To"), ("cc", "Cc"), ("bcc", "Bcc"), ("reply_to", "Reply-To"))


def _address(a: Any) -> str:
    return f"{a['email']} ({a['name']})" if a.get("name") else str(a["email"])


def header_lines(step: Any) -> list[str]:
    """The message's headers as it would go out, one line each (the template escapes them)."""
    p = step["payload"]
    lines = [f"From: {_address(p['from'])}"]
    lines += [f"{label}: {', '.join(_address(a) for a in p[k])}" for k, label in ADDRESS_HEADERS if p.get(k)]
    lines += [f"Subject: {p.get('subject') or ''}", f"Message-ID: {step['message_id']}"]
    lines += [f"{name}: {value}" for name, value in (p.get("headers") or {}).items()]
    return lines


def recipients(step: Any) -> list[str]:
    return [a["email"] for k in ("to", "cc", "bcc") for a in step["payload"].get(k) or []]


env.filters["header_lines"] = header_lines
env.filters["recipients"] = recipients


class Redirect(Exception):
    def __init__(self, url: str):
        self.url = url


class PageError(Exception):
    """An error the page shows in place (a refused sign-in, a conflict), with its status."""

    def __init__(self, error: EvqError, status: int):
        self.error, self.status = error, status


router = APIRouter(prefix="/ops", include_in_schema=False)


def _state(request: Request) -> AppState:
    return request.app.state.evq


def _session(request: Request) -> tuple[Session, bool]:
    """The visitor's session, and whether it is new (then it must be set on the answer)."""
    state = _state(request)
    found = state.sessions.load(request.cookies.get(COOKIE))
    return (found, False) if found is not None else (state.sessions.new(), True)


def render(request: Request, template: str, session: Session, status: int = 200, **context: Any) -> HTMLResponse:
    html = env.get_template(template).render(
        session=session, identity=session.identity, request=request, may_close=_may_close(session), **context
    )
    response = HTMLResponse(html, status_code=status)
    set_cookie(request, response, session)
    return response


def set_cookie(request: Request, response: Response, session: Session) -> None:
    response.set_cookie(
        COOKIE,
        _state(request).sessions.dump(session),
        max_age=_state(request).sessions.max_age,
        path="/ops",
        httponly=True,
        samesite="strict",
        secure=_over_tls(request),
    )


def _over_tls(request: Request) -> bool:
    """Whether the browser reached us over TLS: directly, or through a proxy that says so.
    `evq serve` trusts no proxy header for who the client is (ops/web/slowclients.py), but a
    forged X-Forwarded-Proto can only make the cookie Secure, which costs the forger alone."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def _who(session: Session) -> Caller:
    assert session.identity is not None  # signed_in() made sure
    return Caller.signed_in(session.identity, source=SOURCE)


def _may_close(session: Session) -> bool:
    identity = session.identity
    return identity is not None and identity.may(Permission.RESOLVE)


async def signed_in(request: Request) -> Session:
    """The session of a signed-in visitor whose key is still active; a redirect to sign in otherwise."""
    session, _ = _session(request)
    if session.identity is None or session.key_id is None:
        raise Redirect("/ops/login")
    row = await _state(request).store.key_by_id(session.key_id)
    if row is None or row["revoked_at"] is not None or row["name"] != session.name:
        raise Redirect("/ops/login?ended=revoked")
    if row["session_generation"] != session.generation:
        raise Redirect("/ops/login?ended=signed-out")  # someone signed out of this key's sessions
    return session


async def form(request: Request, session: Session) -> dict[str, str]:
    """The posted form, refused unless it carries this session's CSRF token."""
    try:
        data = await request.form()
    except EvqError:
        raise
    except Exception:
        raise InvalidRequest([{"field": "$body", "message": "not a form"}]) from None
    values = {k: v for k, v in data.items() if isinstance(v, str)}
    if not session.csrf_ok(values.get("csrf")):
        raise PageError(
            AuthFailed("the form is stale or not from this page (CSRF token)", hint="reload the page and try again"),
            403,
        )
    return values


def _filters(values: Any) -> dict[str, str | None]:
    return {k: (values.get(k) or "").strip() or None for k in FILTER_KEYS}


def _query(filters: dict[str, str | None], **extra: Any) -> str:
    return urlencode({**{k: v for k, v in filters.items() if v}, **{k: v for k, v in extra.items() if v}})


# -- signing in -----------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request) -> HTMLResponse:
    session, _ = _session(request)
    notice = ENDED.get(request.query_params.get("ended") or "")
    return render(request, "login.html", session, notice=notice)


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    session, _ = _session(request)
    values = await form(request, session)
    key = values.get("key", "").strip()
    state = _state(request)
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
    parts = split_key(key)
    assert parts is not None  # authenticate accepted it
    row = await state.store.key_by_id(parts[0])
    if row is None:  # revoked and gone between the two reads: not signed in
        return render(request, "login.html", session, status=401, error=AuthFailed("the API key is not valid"))
    response = RedirectResponse("/ops", status_code=303)
    # A new session (and CSRF token) at sign-in: nothing set before it carries over.
    fresh = state.sessions.new(identity=identity, key_id=parts[0], generation=row["session_generation"])
    set_cookie(request, response, fresh)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    session, _ = _session(request)
    await form(request, session)
    if session.key_id is not None and session.generation is not None:
        # On the server, not only in this browser: this cookie (and any copy) is refused from now on.
        await _state(request).store.end_sessions(session.key_id, session.generation)
    response = RedirectResponse("/ops/login", status_code=303)
    set_cookie(request, response, _state(request).sessions.new())
    return response


# -- looking -------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse)
async def overview(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    state = _state(request)
    stats, stats_error = None, None
    try:
        stats = await anyio.to_thread.run_sync(state.read_stats)
    except EvqError as exc:
        stats_error = exc
    who = _who(session)
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


@router.get("/unknown", response_class=HTMLResponse)
async def unknown(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    params = request.query_params
    filters = _filters(params)
    expand = params.get("expand") == "1"
    offset = _int(params.get("offset"), 0)
    state = _state(request)
    who = _who(session)
    try:
        reply = await service.list_steps(
            state.store,
            who,
            statuses=[str(Status.UNKNOWN)],
            filters=filters,
            limit=PAGE_SIZE,
            offset=offset,
            unresolvable=state.policy.unresolvable,
        )
    except InvalidRequest as exc:
        return render(
            request,
            "unknown.html",
            session,
            status=422,
            error=service.json_field_names(exc),
            filters=filters,
            expand=expand,
            rows=[],
            answers={},
            total=0,
            offset=0,
            query=_query(filters),
        )
    answers = await state.store.last_answers([r["id"] for r in reply.data])
    closed = params.get("closed")
    return render(
        request,
        "unknown.html",
        session,
        filters=filters,
        expand=expand,
        rows=reply.data,
        answers=answers,
        total=reply.meta["total"],
        offset=offset,
        page_size=PAGE_SIZE,
        query=_query(filters),
        closed=closed,
        verdicts=list(Verdict),
    )


@router.get("/held", response_class=HTMLResponse)
async def held(request: Request) -> HTMLResponse:
    """The approval queue: held sends oldest first, each whole (why it was held, the decision
    and its rationale, the message as it would go out, when it expires), so a person decides
    on what would be sent and not on a summary."""
    session = await signed_in(request)
    offset = _int(request.query_params.get("offset"), 0)
    state = _state(request)
    who = _who(session)
    reply = await service.list_steps(state.store, who, statuses=[str(Status.HELD)], limit=HELD_PAGE_SIZE, offset=offset)
    shown = []
    for row in reply.data:
        try:
            # show_step, as the step page does: the message's text only for roles that see content.
            shown.append((await service.show_step(state.store, who, row["id"])).data)
        except NotFound:
            continue  # pruned between the two reads: nothing left to decide on
    return render(
        request,
        "held.html",
        session,
        rows=shown,
        total=reply.meta["total"],
        offset=offset,
        page_size=HELD_PAGE_SIZE,
    )


def _int(text: str | None, default: int) -> int:
    try:
        value = int(text or default)
    except ValueError:
        return default
    return min(max(value, 0), 2**31 - 1)


@router.get("/steps/{step_id}", response_class=HTMLResponse)
async def step(request: Request, step_id: int) -> HTMLResponse:
    session = await signed_in(request)
    back = _back(request.query_params.get("from"))
    done = DONE.get(request.query_params.get("done") or "")
    return await _step_page(request, session, step_id, back, done=done)


def _back(query: str | None) -> dict[str, str | None]:
    """The list's filters the visitor came from (only filter keys: this is never a URL)."""
    return _filters(dict(parse_qsl(query or "")))


async def _step_page(
    request: Request, session: Session, step_id: int, back: dict[str, str | None], status: int = 200, **context: Any
) -> HTMLResponse:
    state = _state(request)
    who = _who(session)
    reply = await service.show_step(state.store, who, step_id, unresolvable=state.policy.unresolvable)
    return render(
        request,
        "step.html",
        session,
        status=status,
        d=reply.data,
        back=back,
        back_query=_query(back),
        verdicts=list(Verdict),
        cancellable=CANCELLABLE,
        **context,
    )


@router.get("/runs", response_class=HTMLResponse)
async def find_run(request: Request) -> Response:
    """The run search, and the form of a run's address the page links to: a run id in the
    query never meets path normalisation, which browsers apply even to %2E%2E, so ids such as
    "..", "." or "a/../b" (the CLI takes any) are reachable too."""
    await signed_in(request)
    run_id = (request.query_params.get("run_id") or "").strip()
    if not run_id:
        raise Redirect("/ops")
    return await trace(request, run_id)


@router.get("/runs/{run_id:path}", response_class=HTMLResponse)  # run ids may hold "/"
async def trace(request: Request, run_id: str) -> HTMLResponse:
    session = await signed_in(request)
    who = _who(session)
    state = _state(request)
    reply = await service.show_run(state.store, who, run_id[:200], unresolvable=state.policy.unresolvable)
    return render(request, "trace.html", session, d=reply.data)


# -- closing ---------------------------------------------------------------------------


def _resolution(values: dict[str, str]) -> Resolution:
    blank = lambda name: (values.get(name) or "").strip() or None  # noqa: E731
    return Resolution.parse(
        values.get("verdict", ""),
        values.get("note"),
        reason=blank("reason"),
        provider_message_id=blank("provider_message_id"),
        evidence_url=blank("evidence_url"),
    )


async def _posted(request: Request) -> tuple[Session, dict[str, str]]:
    session = await signed_in(request)
    return session, await form(request, session)


async def _resolve(
    request: Request, session: Session, values: dict[str, str], selection: Selection, *, dry_run: bool = False
) -> service.Reply:
    state = _state(request)
    return await service.resolve(
        state.store,
        _who(session),
        _resolution(values),
        selection,
        default_max_attempts=state.settings.max_attempts,
        dry_run=dry_run,
        unresolvable=state.policy.unresolvable,
    )


def _refusal(exc: EvqError) -> tuple[int, EvqError]:
    """The status a refused close is shown with, and the error as the page names its fields."""
    if isinstance(exc, InvalidRequest):
        return 422, service.json_field_names(exc)
    return (409 if isinstance(exc, StateConflict) else 403), exc


@router.post("/steps/{step_id}/close", response_class=HTMLResponse)
async def close(request: Request, step_id: int) -> Response:
    session, values = await _posted(request)
    back = _filters(values)
    try:
        reply = await _resolve(request, session, values, Selection(step_id=step_id))
    except (InvalidRequest, StateConflict, AuthFailed) as exc:
        status, shown = _refusal(exc)
        return await _step_page(request, session, step_id, back, status=status, error=shown, posted=values)
    done = reply.data["results"][0]
    return RedirectResponse(f"/ops/unknown?{_query(back, closed=done['id'])}", status_code=303)


# -- held sends: approve, deny, cancel ----------------------------------------------------


def _edits(values: dict[str, str]) -> dict[str, str] | None:
    """The corrections an approver typed: a blank field is not a correction (the send goes
    out as the agent asked it); anything else replaces that part, and makes a new request hash."""
    edits = {k: values[k] for k in ("subject", "text") if (values.get(k) or "").strip()}
    return edits or None


def _deciding(session: Session) -> None:
    """Approving and denying are an operator's or admin's: an agent's session is refused here,
    before ops/app/approvals.py refuses it again, so a forged form never reaches the store."""
    identity = session.identity
    if identity is None or not identity.may(Permission.RESOLVE):
        raise Forbidden(
            f"the key's role ({identity.role if identity else 'none'}) may not approve or deny a held send",
            hint="an operator or admin key decides on held sends",
        )


async def _decided(request: Request, step_id: int, action: str, decide: Any) -> Response:
    """Run one decision on a step; on success show the step in its new state, otherwise the
    step page with the refusal in place (and what was typed, so nothing is lost)."""
    session, values = await _posted(request)
    try:
        await decide(session, values)
    except (InvalidRequest, StateConflict, AuthFailed) as exc:
        status, shown = _refusal(exc)
        return await _step_page(request, session, step_id, {}, status=status, error=shown, posted=values)
    return RedirectResponse(f"/ops/steps/{step_id}?done={action}", status_code=303)


def _note(values: dict[str, str], *, required: bool = False) -> str:
    note = (values.get("note") or "").strip()
    if required and not note:
        # The page asks for it before anything is sent (ops/app/approvals.py refuses it too).
        raise InvalidRequest([{"field": "note", "message": "required: say why you decide so"}])
    return note


@router.post("/steps/{step_id}/approve", response_class=HTMLResponse)
async def approve(request: Request, step_id: int) -> Response:
    async def decide(session: Session, values: dict[str, str]) -> None:
        _deciding(session)
        await approvals.approve(
            _state(request).store, _who(session), step_id, note=_note(values, required=True), edits=_edits(values)
        )

    return await _decided(request, step_id, "approved", decide)


@router.post("/steps/{step_id}/deny", response_class=HTMLResponse)
async def deny(request: Request, step_id: int) -> Response:
    async def decide(session: Session, values: dict[str, str]) -> None:
        _deciding(session)
        await approvals.deny(_state(request).store, _who(session), step_id, note=_note(values, required=True))

    return await _decided(request, step_id, "denied", decide)


@router.post("/steps/{step_id}/cancel", response_class=HTMLResponse)
async def cancel(request: Request, step_id: int) -> Response:
    async def decide(session: Session, values: dict[str, str]) -> None:
        # Who may cancel (the key that enqueued it, or an operator) is ops/app/approvals.py's rule.
        await approvals.cancel(_state(request).store, _who(session), step_id, note=_note(values) or None)

    return await _decided(request, step_id, "cancelled", decide)


@router.post("/unknown/preview", response_class=HTMLResponse)
async def bulk_preview(request: Request) -> HTMLResponse:
    session, values = await _posted(request)
    filters = _filters(values)
    page = {"filters": filters, "posted": values, "query": _query(filters), "bulk_max": BULK_MAX}
    try:
        selection = Selection(statuses=(str(Status.UNKNOWN),), filters=filters, limit=BULK_MAX)
        reply = await _resolve(request, session, values, selection, dry_run=True)
    except (InvalidRequest, AuthFailed) as exc:
        status, shown = _refusal(exc)
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
    session, values = await _posted(request)
    filters = _filters(values)
    try:
        ids = tuple(int(i) for i in values.get("ids", "").split(",") if i.strip())
        if not ids or len(ids) > BULK_MAX:
            raise ValueError
    except ValueError:
        raise InvalidRequest([{"field": "ids", "message": f"1 to {BULK_MAX} step ids from a preview"}]) from None
    try:
        reply = await _resolve(request, session, values, Selection(statuses=(str(Status.UNKNOWN),), ids=ids))
    except (InvalidRequest, AuthFailed) as exc:
        status, shown = _refusal(exc)
        return render(
            request,
            "preview.html",
            session,
            status=status,
            error=shown,
            filters=filters,
            rows=[],
            posted=values,
            query=_query(filters),
            bulk_max=BULK_MAX,
        )
    return render(request, "closed.html", session, d=reply.data, filters=filters, query=_query(filters))


@router.get("/static/ops.css")
async def stylesheet() -> Response:
    css = resources.files("evq.ops.web").joinpath("static", "ops.css").read_text(encoding="utf-8")
    return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=3600"})
