"""The operators' queues: unknown rows oldest first (filters in the URL), held sends oldest first, each shown whole."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app import service
from evq.ops.app.service import MAX_ID
from evq.ops.web.page.common import (
    BULK_ACTIONS,
    FILTER_KEYS,
    HELD_PAGE_SIZE,
    PAGE_SIZE,
    BadRequest,
    PageError,
    app_state,
    as_bad_request,
    caller_of,
    concurrently,
    filters_of,
    list_params,
    offset_param,
    page_offset,
    query_string,
    render,
    router,
    signed_in,
)
from evq.ops.web.page.step import done_notice
from evq.worker.errors import InvalidRequest
from evq.worker.ports import SUBJECT_SCAN_CAP
from evq.worker.resolution import Verdict
from evq.worker.states import Status

# What the unknown list's address may carry: its filters, a page, the full-recipients switch,
# and the step a close just took off it (the notice).
UNKNOWN_PARAMS = (*FILTER_KEYS, "expand", "offset", "closed", "pick")


@router.get("/unknown", response_class=HTMLResponse)
async def unknown(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    params = request.query_params
    filters = filters_of(params)
    expand = params.get("expand") == "1"
    offset = 0
    state = app_state(request)
    who = caller_of(session)
    try:
        list_params(params, UNKNOWN_PARAMS)
        offset = offset_param(params)
        if params.get("expand", "1") != "1":
            raise BadRequest([{"field": "expand", "message": f"1 or absent, got {params['expand'][:40]!r}"}])
        if params.get("pick", "page") != "page":
            raise BadRequest([{"field": "pick", "message": f"page or absent, got {params['pick'][:40]!r}"}])
        if not (params.get("closed") or "0").isdigit():
            raise BadRequest([{"field": "closed", "message": "a step id"}])
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
            status=400,
            error=exc if isinstance(exc, BadRequest) else as_bad_request(exc),
            filters=filters,
            expand=expand,
            rows=[],
            answers={},
            facts={},
            total=0,
            offset=0,
            query=query_string(filters),
        )
    ids = [r["id"] for r in reply.data]
    answers, facts = await concurrently(state.store.last_answers(ids), state.store.list_facts(ids))
    closed = params.get("closed")
    return render(
        request,
        "unknown.html",
        session,
        filters=filters,
        expand=expand,
        rows=reply.data,
        answers=answers,
        facts=facts,
        pick_page=params.get("pick") == "page",
        total=reply.meta["total"],
        scanned=reply.meta.get("subject_scanned"),
        scan_cap=SUBJECT_SCAN_CAP,
        offset=offset,
        page_size=PAGE_SIZE,
        query=query_string(filters),
        closed=closed,
        verdicts=list(Verdict),
    )


@router.get("/held", response_class=HTMLResponse)
async def held(request: Request) -> HTMLResponse:
    """The approval queue: held sends oldest first, each whole (why it was held, the decision
    and its rationale, the message as it would go out, when it expires), so a person decides
    on what would be sent and not on a summary."""
    session = await signed_in(request)
    offset = page_offset(request.query_params, ("offset", "pick", "approved"))
    if request.query_params.get("pick", "page") != "page":
        raise PageError(BadRequest([{"field": "pick", "message": "page or absent"}]), 400)
    approved = request.query_params.get("approved")
    if approved is not None and not (approved.isascii() and approved.isdigit() and 0 < int(approved) <= MAX_ID):
        raise PageError(BadRequest([{"field": "approved", "message": "a step id"}]), 400)
    state = app_state(request)
    who = caller_of(session)
    # The notice of an approval made from this inbox, only if that step's latest decision is
    # an approval (a hand-made address cannot claim one that did not happen).
    notice = None
    if approved is not None:
        evidence = (await service.show_steps(state.store, who, [int(approved)])).data
        notice = done_notice("approved", evidence[0]["evidence"]) if evidence else None
    reply = await service.list_steps(state.store, who, statuses=[str(Status.HELD)], limit=HELD_PAGE_SIZE, offset=offset)
    # show_step of the whole page in one read, as the step page shows one: the message's text
    # only for roles that see content; a step pruned between the two reads is left out.
    shown = (await service.show_steps(state.store, who, [row["id"] for row in reply.data])).data
    # Whose sends land here (issue 30): the rules, and each key that enqueues with its approval.
    policy = (await service.show_policy(state.store, who, state.settings)).data
    return render(
        request,
        "held.html",
        session,
        rows=shown,
        total=reply.meta["total"],
        offset=offset,
        page_size=HELD_PAGE_SIZE,
        policy=policy,
        held_by=rules_in_words(policy),
        # The step list's bulk form for held rows (approve, deny, cancel: each row as its own
        # command checks it, so the key that enqueued a send never approves it).
        actions=[a for a, states in BULK_ACTIONS.items() if str(Status.HELD) in states] if reply.data else [],
        tab=str(Status.HELD),
        filters={},
        pick_page=request.query_params.get("pick") == "page",
        approved=int(approved) if notice else None,
        approved_notice=notice,
    )


def rules_in_words(policy: dict[str, Any]) -> str:
    """The installation's hold rules (`evq policy show`'s data) in a line for the held queue."""
    if policy["always"]:
        return "every send"
    rules = []
    if policy["first_contact"] != "off":
        rules.append(f"a first contact ({policy['first_contact']})")
    if policy["max_recipients"] is not None:
        rules.append(f"more than {policy['max_recipients']} recipients")
    if policy["hours"] is not None:
        hours = policy["hours"]
        rules.append(f"outside {hours['start']}-{hours['end']} {hours['timezone']}")
    if policy["budgets"]:
        rules.append(f"over a budget ({policy['over_budget']})")
    return ", ".join(rules) or "none"
