"""One step (its decision, request, evidence and what to do next), a run's trace, and closing one unknown row."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from evq.ops.app import approvals, service
from evq.ops.app.service import Selection
from evq.ops.web.page.common import (
    CANCELLABLE,
    DONE,
    PAGE_SIZE,
    Redirect,
    app_state,
    caller_of,
    chosen_verdict,
    filters_of,
    page_offset,
    posted,
    query_string,
    refusal,
    render,
    resolve,
    router,
    signed_in,
)
from evq.ops.web.page.timeline import by_step, step_timeline, trace_rows
from evq.ops.web.session import Session
from evq.worker.errors import AuthFailed, InvalidRequest, StateConflict
from evq.worker.resolution import Verdict, requeueable
from evq.worker.states import Status


@router.get("/steps/{step_id}", response_class=HTMLResponse)
async def step(request: Request, step_id: int) -> HTMLResponse:
    session = await signed_in(request)
    back = _back(request.query_params.get("from"))
    return await step_page(request, session, step_id, back, done_key=request.query_params.get("done"))


# The evidence each decision writes: a ``done=`` notice is shown only when the step's most
# recent operator decision is that one, so a hand-made URL cannot claim a success that did not
# happen. Not the step's state: a worker may already have claimed or sent an approved or
# requeued step by the time the page is drawn (it is then in flight or accepted, and the
# approval still happened).
DECISION_KINDS = frozenset({"approved", "denied", "cancelled", "operator_resolved"})


def _decision_key(row: dict[str, Any]) -> str | None:
    kind = row.get("kind")
    if kind == "operator_resolved":
        return "requeued" if (row.get("detail") or {}).get("requeued") else None
    return str(kind) if kind in DECISION_KINDS else None


def done_notice(key: str | None, evidence: list[dict[str, Any]]) -> str | None:
    """The success text for ``done=key`` if the step's latest decision is that one."""
    if key not in DONE:
        return None
    decisions = [row for row in evidence if row.get("kind") in DECISION_KINDS]
    return DONE[key] if decisions and _decision_key(decisions[-1]) == key else None


def _back(query: str | None) -> dict[str, str | None]:
    """The list's filters the visitor came from (only filter keys: this is never a URL)."""
    return filters_of(dict(parse_qsl(query or "")))


async def step_page(
    request: Request,
    session: Session,
    step_id: int,
    back: dict[str, str | None],
    status: int = 200,
    done_key: str | None = None,
    **context: Any,
) -> HTMLResponse:
    state = app_state(request)
    who = caller_of(session)
    reply = await service.show_step(state.store, who, step_id, unresolvable=state.policy.unresolvable)
    context.setdefault("done", done_notice(done_key, reply.data["evidence"]))
    assert session.identity is not None  # signed_in() made sure
    # The forms this key may use here: ops/app/approvals.py's rule, which refuses the others.
    may = approvals.may_decide(session.identity, reply.data["decision"], step_id)
    return render(
        request,
        "step.html",
        session,
        status=status,
        d=reply.data,
        back=back,
        back_query=query_string(back),
        verdicts=list(Verdict),
        cancellable=CANCELLABLE,
        may=may,
        own=session.identity.enqueued(reply.data["decision"]),
        requeueable=requeueable(reply.data["step"]["status"], reply.data["step"].get("reason")),
        html_source=request.query_params.get("html") == "source",
        timeline=step_timeline(reply.data["step"], reply.data["decision"], reply.data["evidence"]),
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
    who = caller_of(session)
    state = app_state(request)
    # A page of the run's steps at a time, as the lists (PAGE_SIZE, Previous and Next).
    offset = page_offset(request.query_params, ("offset", "run_id"))
    reply = await service.show_run(
        state.store, who, run_id[:200], limit=PAGE_SIZE, offset=offset, unresolvable=state.policy.unresolvable
    )
    return render(
        request,
        "trace.html",
        session,
        d=reply.data,
        events=(events := trace_rows(reply.data["events"])),
        groups=by_step(events),
        page=reply.meta,
        page_size=PAGE_SIZE,
    )


@router.post("/steps/{step_id}/close", response_class=HTMLResponse)
async def close(request: Request, step_id: int) -> Response:
    session, values = await posted(request)
    back = filters_of(values)
    try:
        chosen_verdict(values)
        reply = await resolve(request, session, values, Selection(step_id=step_id))
    except (InvalidRequest, StateConflict, AuthFailed) as exc:
        status, shown = refusal(exc)
        return await step_page(request, session, step_id, back, status=status, error=shown, posted=values)
    done = reply.data["results"][0]
    # The notice follows what happened, not what the form said: a rejected row requeued goes back
    # to its step (now retryable); any other close back to the unknown list.
    if done.get("from_status") == str(Status.REJECTED) and done.get("to_status") == str(Status.RETRYABLE):
        return RedirectResponse(f"/ops/steps/{step_id}?done=requeued", status_code=303)
    return RedirectResponse(f"/ops/unknown?{query_string(back, closed=done['id'])}", status_code=303)
