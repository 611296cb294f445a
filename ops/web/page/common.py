"""What every page shares: the templates and their filters, the visitor's session, rendering,
the signed-in check, CSRF-checked forms, the filters in the URL and a close's resolution."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
from collections.abc import Awaitable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from importlib import resources
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, pass_context, select_autoescape
from markupsafe import Markup, escape

from evq.ops.app import service
from evq.ops.app.age import age
from evq.ops.app.commands import CREDENTIAL, Kind, command
from evq.ops.app.contract import to_json
from evq.ops.app.service import Caller, Selection
from evq.ops.time_zones import time_zone
from evq.ops.web.session import COOKIE, Session
from evq.ops.web.state import AppState
from evq.worker.errors import AuthFailed, BadKey, EvqError, InvalidRequest, StateConflict
from evq.worker.keys import Permission, identity_of
from evq.worker.resolution import Resolution
from evq.worker.states import Status

SOURCE = "the sign-in form"
ENDED = {
    "revoked": "That key was revoked: sign in with another.",
    "signed-out": "This session was signed out: sign in again.",
}
FILTER_KEYS = ("run_id", "provider", "older_than", "recipient_domain", "subject")
OVERVIEW_REFUSALS = 10  # the latest refused enqueues on the overview
PAGE_SIZE = 100
HELD_PAGE_SIZE = 25  # each held send is shown whole (its message and the decision), so fewer a page
# The steps a person may still stop before a worker claims them (docs/design.md, "Approvals and budgets").
CANCELLABLE = (str(Status.HELD), str(Status.PENDING), str(Status.RETRYABLE))
DONE = {
    "approved": "Approved: the send is released and goes out with the same key and Message-ID.",
    "denied": "Denied: the send is rejected (reason denied); its notify address is told if its sender is known to mail it.",
    "cancelled": "Cancelled: the send is rejected (reason cancelled) and will not go out.",
    "requeued": "Requeued: the send goes out again with the same key and Message-ID.",
}
BULK_MAX = 500  # rows one bulk action may act on; a preview says when more match
# Each bulk action of the step list and the states its rows must be in (docs/design.md, "Lists and bulk actions").
BULK_ACTIONS: dict[str, tuple[str, ...]] = {
    "close": (str(Status.UNKNOWN),),
    "retry": (str(Status.REJECTED),),
    "cancel": CANCELLABLE,
    "approve": (str(Status.HELD),),
    "deny": (str(Status.HELD),),
}

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


def as_text(value: Any) -> str:
    return to_json(value) if isinstance(value, (dict, list)) else str(value)


def hold_reasons(hold: Any) -> list[tuple[str, str]]:
    """Why a send was held, as (rule, why) pairs, from ``email_steps.hold``: a list of rules
    (``{"rule", "why", ...}``) or an object listing ``rules`` and ``budgets``. Whatever its
    shape the page shows all of it as text, so an unexpected shape still says what it holds."""
    if hold is None:
        return []
    if isinstance(hold, dict):
        listed = [*(hold.get("rules") or []), *(hold.get("budgets") or [])]
        return hold_reasons(listed) if listed else [(str(k), as_text(v)) for k, v in hold.items()]
    if not isinstance(hold, list):
        return [(as_text(hold), "")]
    out: list[tuple[str, str]] = []
    for item in hold:
        if isinstance(item, dict):
            others = {k: v for k, v in item.items() if k not in ("rule", "budget", "why")}
            why = item.get("why") or (to_json(others) if others else "")
            out.append((str(item.get("rule") or item.get("budget") or "?"), str(why)))
        else:
            out.append((as_text(item), ""))
    return out


env.filters["hold_reasons"] = hold_reasons


def _instant(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


@pass_context
def when(context: Any, value: Any) -> Markup:
    """A moment as the page shows it: relative ("3h05m ago", "in 5m") in a ``<time>`` whose
    ``datetime`` is the exact instant and whose title is that instant in the operator's time
    zone (the template context's ``tz``; UTC when none is chosen). "-" for none."""
    at = _instant(value)
    if at is None:
        return Markup("-")
    zone: tzinfo = context.get("tz") or UTC
    seconds = (datetime.now(UTC) - at).total_seconds()
    said = f"{age(seconds)} ago" if seconds >= 0 else f"in {age(-seconds)}"
    local = at.astimezone(zone)
    title = local.isoformat(timespec="seconds") + (f" ({local.tzname()})" if local.tzname() else "")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        at.astimezone(UTC).isoformat(timespec="seconds"), title, escape(said)
    )


env.filters["when"] = when


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


# The email's HTML part is shown in <iframe sandbox srcdoc=...>: no allow-* token, so no script,
# form, plugin, popup or top navigation, and an opaque origin (no cookie, no same-origin read).
# The frame inherits the page's CSP (nothing remote: img-src 'self' at most); this policy first
# in its document refuses even that, so a tracking pixel pointing back at evq serve stays unloaded
# too. A CSP can only be narrowed by a later one, so nothing in the email can lift it.
EMAIL_CSP = "default-src 'none'; style-src 'unsafe-inline'"


def email_srcdoc(html: str) -> str:
    """The HTML part as the frame's document: the locked-down policy, then the email (the
    template escapes it as an attribute value, so it cannot end the srcdoc attribute)."""
    return f'<meta http-equiv="Content-Security-Policy" content="{EMAIL_CSP}">' + html


def form_text(text: str | None) -> str:
    """A text as a form's textarea posts it back: a browser sends every line end as CRLF."""
    return (text or "").replace("\r\n", "\n")


def form_digest(text: str | None) -> str:
    """What a form shows in a textarea, as a hidden field: whether the posted text is the one it
    showed (ops/web/page/decisions.py), whatever the browser did to the line ends."""
    return hashlib.sha256(form_text(text).encode()).hexdigest()


env.filters["header_lines"] = header_lines
env.filters["form_digest"] = form_digest
env.filters["email_srcdoc"] = email_srcdoc
env.filters["recipients"] = recipients


def cli_equivalent(path: str, /, **values: Any) -> str:
    """The command line that does what a form on the page does, shell-quoted (shlex.quote), so an
    operator can copy it or script it: ``cli_equivalent("steps.resolve", step_id=123,
    verdict="accepted", note="in the log")`` -> ``evq steps resolve 123 --as accepted --note 'in the log'``.

    ``path`` is the command table's name (ops/app/commands.py) and the keywords are its parameters'
    ``dest``s, so the words and flags are the table's own and cannot drift from `evq --help`.
    Arguments come first, then options in the table's order; None, "" and False are left out, a
    repeatable one takes a list (one flag each), a flag True is the bare flag. A name the command
    does not have, and the API key (never printed: it comes from EVQ_API_KEY), raise ValueError."""
    cmd = command(path)
    known = {p.dest: p for p in cmd.params}
    unknown = sorted(set(values) - set(known) | ({CREDENTIAL} & set(values)))
    if unknown:
        raise ValueError(f"{path} has no parameter {', '.join(unknown)} the page may show")
    words = ["evq", *cmd.words.split()]
    ordered = [p for p in cmd.params if p.kind is Kind.ARGUMENT] + [
        p for p in cmd.params if p.kind is not Kind.ARGUMENT
    ]
    for param in ordered:
        value = values.get(param.dest)
        if value is None or value == "" or value is False:
            continue
        if param.kind is Kind.FLAG:
            words.append(str(param.flag))
            continue
        given = (
            list(value) if param.repeatable and isinstance(value, Iterable) and not isinstance(value, str) else [value]
        )
        for one in given:
            words += [str(one)] if param.kind is Kind.ARGUMENT else [str(param.flag), str(one)]
    return " ".join(shlex.quote(w) for w in words)


env.globals["cli_equivalent"] = cli_equivalent


class Redirect(Exception):
    def __init__(self, url: str):
        self.url = url


class PageError(Exception):
    """An error the page shows in place (a refused sign-in, a conflict), with its status."""

    def __init__(self, error: EvqError, status: int):
        self.error, self.status = error, status


router = APIRouter(prefix="/ops", include_in_schema=False)


def app_state(request: Request) -> AppState:
    return request.app.state.evq


def visitor_session(request: Request) -> tuple[Session, bool]:
    """The visitor's session, and whether it is new (then it must be set on the answer)."""
    state = app_state(request)
    found = state.sessions.load(request.cookies.get(COOKIE))
    return (found, False) if found is not None else (state.sessions.new(), True)


def zone_of(request: Request, session: Session) -> ZoneInfo:
    """The zone the page shows exact times in: the session's choice, else EVQ_OPS_TIMEZONE (checked
    at startup). A session's zone the system no longer knows falls back to the default, not an error."""
    default = app_state(request).settings.ops_timezone
    for name in (session.tz, default):
        if name:
            try:
                return ZoneInfo(time_zone(name))
            except ValueError:
                continue
    return ZoneInfo("UTC")


def render(request: Request, template: str, session: Session, status: int = 200, **context: Any) -> HTMLResponse:
    # The status goes to the template too: the error page names it in its title and heading.
    html = env.get_template(template).render(
        session=session,
        identity=session.identity,
        request=request,
        may_close=may_close(session),
        status=status,
        tz=zone_of(request, session),
        **context,
    )
    response = HTMLResponse(html, status_code=status)
    set_cookie(request, response, session)
    return response


def set_cookie(request: Request, response: Response, session: Session) -> None:
    response.set_cookie(
        COOKIE,
        app_state(request).sessions.dump(session),
        max_age=app_state(request).sessions.max_age,
        path="/ops",
        httponly=True,
        samesite="strict",
        secure=over_tls(request),
    )


def over_tls(request: Request) -> bool:
    """Whether the browser reached us over TLS: directly, or through a proxy that says so.
    `evq serve` trusts no proxy header for who the client is (ops/web/slowclients.py), but a
    forged X-Forwarded-Proto can only make the cookie Secure, which costs the forger alone."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return request.url.scheme == "https" or forwarded == "https"


def caller_of(session: Session) -> Caller:
    assert session.identity is not None  # signed_in() made sure
    return Caller.signed_in(session.identity, source=SOURCE)


def may_close(session: Session) -> bool:
    identity = session.identity
    return identity is not None and identity.may(Permission.RESOLVE)


async def concurrently(*reads: Awaitable[Any]) -> list[Any]:
    """The reads' answers, awaited together (each store read takes its own connection of the
    pool); when any fails, the first failure (in the reads' order) is raised, but only once
    every read has ended, so none is left running behind the error page."""
    answers = await asyncio.gather(*reads, return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers


async def signed_in(request: Request) -> Session:
    """The session of a signed-in visitor whose key is still active, with the identity it acts
    under built from the key's row as it is now (worker/keys.py's identity_of, as for every other
    interface: the same key id, name and role); a redirect to sign in otherwise."""
    session, _ = visitor_session(request)
    if session.key_id is None:
        raise Redirect("/ops/login")
    row = await app_state(request).store.key_by_id(session.key_id)
    if row is None:
        raise Redirect("/ops/login?ended=revoked")
    try:
        identity = identity_of(session.key_id, row)
    except BadKey:
        raise Redirect("/ops/login?ended=revoked") from None
    if row["session_generation"] != session.generation:
        raise Redirect("/ops/login?ended=signed-out")  # someone signed out of this key's sessions
    return replace(session, identity=identity)


async def shown_session(request: Request) -> Session:
    """The session an error page is drawn with: the signed-in one (with its identity as the key is
    now) while it still is, else the visitor's, whose page names nobody."""
    try:
        return await signed_in(request)
    except (Redirect, EvqError):
        return visitor_session(request)[0]


async def form(request: Request, session: Session) -> dict[str, str]:
    """The posted form, refused unless it carries this session's CSRF token."""
    try:
        data = await request.form()
    except EvqError:
        raise
    except Exception:
        raise InvalidRequest([{"field": "$body", "message": "not a form"}]) from None
    values = {k: v for k, v in data.items() if isinstance(v, str)}
    # The rows a list's boxes picked: one "pick" field each, kept as "id,id,..." (picked_ids reads it).
    if "pick" in data:
        values["pick"] = ",".join(v for v in data.getlist("pick") if isinstance(v, str))
    if not session.csrf_ok(values.get("csrf")):
        raise PageError(
            AuthFailed("the form is stale or not from this page (CSRF token)", hint="reload the page and try again"),
            403,
        )
    # PostgreSQL text holds no NUL (psycopg refuses it: a 500), so no form may carry one, as the
    # query-string guard refuses one for a GET.
    with_nul = sorted(k for k, v in values.items() if "\x00" in v or "\x00" in k)
    if with_nul:
        refused = InvalidRequest([{"field": k[:80], "message": "holds a NUL character"} for k in with_nul])
        raise PageError(refused, 422)
    return values


def filters_of(values: Any) -> dict[str, str | None]:
    return {k: (values.get(k) or "").strip() or None for k in FILTER_KEYS}


def list_filters(values: Any) -> dict[str, str | None]:
    """The step list's filters and its search box (``q``), as the URL carries them."""
    # Not cut short: a longer search is refused by the service (SEARCH_MAX), as on the CLI.
    return {**filters_of(values), "q": (values.get("q") or "").strip() or None}


def searching(filters: dict[str, str | None]) -> dict[str, str | None]:
    """The list's filters as ops/app/service.py takes them: the search box is its ``search``."""
    return {**{k: v for k, v in filters.items() if k != "q"}, "search": filters.get("q")}


def query_string(filters: dict[str, str | None], **extra: Any) -> str:
    return urlencode({**{k: v for k, v in filters.items() if v}, **{k: v for k, v in extra.items() if v}})


class BadRequest(InvalidRequest):
    """A request no page of ours draws (a list's address with a parameter it does not take or a
    value it cannot read, a close without a verdict): a 400 naming the field and why."""


class Unchosen(BadRequest):
    """A close posted without a verdict: no form the page draws lets one through (the select is
    ``required`` with an empty first option: nothing is preselected)."""


def list_params(params: Any, allowed: Iterable[str]) -> None:
    """Refuse (400) a list's address carrying a parameter the list does not take: a mistyped
    filter silently ignored would show every row as if it had matched."""
    unknown = sorted(set(params.keys()) - set(allowed))
    if unknown:
        raise BadRequest(
            [
                {"field": k[:80], "message": f"not a parameter of this list (it takes {', '.join(allowed)})"}
                for k in unknown
            ],
            hint="remove it or fix its name; nothing is ignored silently",
        )


def offset_param(params: Any) -> int:
    """A list's ``offset``: a whole number from 0; anything else is refused (400), not read as 0."""
    text = params.get("offset")
    if text is None or text == "":
        return 0
    if not (text.isascii() and text.isdigit()) or int(text) > 2**31 - 1:
        raise BadRequest([{"field": "offset", "message": f"a whole number from 0, got {text[:40]!r}"}])
    return int(text)


def page_offset(params: Any, allowed: Iterable[str]) -> int:
    """The offset of a list with no filters of its own (held, a run's trace), after its address
    is checked (list_params): a refusal is the error page, with its 400."""
    try:
        list_params(params, allowed)
        return offset_param(params)
    except BadRequest as exc:
        raise PageError(exc, 400) from None


def as_bad_request(exc: InvalidRequest) -> BadRequest:
    """A list's filter the service refused (an unreadable --older-than, a search too long), as the
    page's 400 naming the URL's parameter."""
    named = service.json_field_names(exc)
    return BadRequest(
        [{**f, "field": "q" if f["field"] == "search" else f["field"]} for f in named.errors], hint=named.hint
    )


def chosen_verdict(values: dict[str, str]) -> str:
    """The verdict a close form posted; refused (Unchosen) when none was chosen, before anything
    is read: a close has no default verdict, so a note and one click never record a send as
    accepted (or anything else) that nobody chose."""
    verdict = (values.get("verdict") or "").strip()
    if not verdict:
        raise Unchosen(
            [{"field": "verdict", "message": "required: choose one (accepted, rejected...); a close has no default"}],
            hint="pick the verdict you found in the provider's log; nothing was closed",
        )
    return verdict


def picked_ids(values: dict[str, str]) -> tuple[int, ...]:
    """The step ids a list's boxes picked (form(): "pick" as "id,id,..."); at least one, at most
    BULK_MAX, each a step id: anything else is refused (400), never read as "every row"."""
    try:
        ids = tuple(dict.fromkeys(int(i) for i in (values.get("pick") or "").split(",") if i.strip()))
        if not ids or len(ids) > BULK_MAX or not all(1 <= i <= 2**63 - 1 for i in ids):
            raise ValueError
    except ValueError:
        raise BadRequest(
            [{"field": "pick", "message": f"tick 1 to {BULK_MAX} rows of the list to preview the picked rows"}],
            hint="or preview every row the filter matches",
        ) from None
    return ids


def answer_words(a: Any) -> str:
    """A provider's last answer in a few words for a one-line row: the outcome and its reason
    code, or what kind of answer it was ("no answer: lost"); the whole answer is the cell's title."""
    if not a:
        return "-"
    outcome = a.get("outcome") or "no answer"
    reason = a.get("reason")
    return f"{outcome} ({reason})" if reason else str(outcome)


env.filters["answer_words"] = answer_words


def resolution_of(values: dict[str, str]) -> Resolution:
    blank = lambda name: (values.get(name) or "").strip() or None  # noqa: E731
    return Resolution.parse(
        values.get("verdict", ""),
        values.get("note"),
        reason=blank("reason"),
        provider_message_id=blank("provider_message_id"),
        evidence_url=blank("evidence_url"),
    )


async def posted(request: Request) -> tuple[Session, dict[str, str]]:
    session = await signed_in(request)
    return session, await form(request, session)


def preview_seal(request: Request, session: Session, purpose: str, fields: dict[str, str]) -> str:
    """The seal a preview's apply form carries (ops/web/session.py, Sessions.seal)."""
    return app_state(request).sessions.seal(session, purpose, fields)


def check_preview_seal(
    request: Request, session: Session, purpose: str, fields: dict[str, str], seal: str | None
) -> None:
    """Refuse, before anything changes, an apply whose rows, states, note or verdict are not
    those of a preview this server rendered for this session: changed in the form, or a form
    of another session (a forged or replayed post, a page left open across a sign-in)."""
    if not app_state(request).sessions.sealed(session, purpose, fields, seal):
        message = "not a preview this server showed in this session, or changed since: nothing was done"
        raise InvalidRequest(
            [{"field": "seal", "message": message}],
            hint="go back to the list and preview again; the apply acts only on the rows the preview shows",
        )


async def resolve(
    request: Request, session: Session, values: dict[str, str], selection: Selection, *, dry_run: bool = False
) -> service.Reply:
    state = app_state(request)
    return await service.resolve(
        state.store,
        caller_of(session),
        resolution_of(values),
        selection,
        default_max_attempts=state.settings.max_attempts,
        dry_run=dry_run,
        unresolvable=state.policy.unresolvable,
    )


def refusal(exc: EvqError) -> tuple[int, EvqError]:
    """The status a refused close is shown with, and the error as the page names its fields."""
    if isinstance(exc, BadRequest):
        return 400, exc
    if isinstance(exc, InvalidRequest):
        return 422, service.json_field_names(exc)
    return (409 if isinstance(exc, StateConflict) else 403), exc
