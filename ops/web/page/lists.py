"""A step list for every state: tabs with their counts for the current search and filters,
each state's own columns, pages of PAGE_SIZE, the filters and the search in the URL, and
the bulk form (closed) below it for the actions that apply to the chosen state."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app import service
from evq.ops.web.page.common import (
    BULK_ACTIONS,
    FILTER_KEYS,
    PAGE_SIZE,
    BadRequest,
    app_state,
    as_bad_request,
    caller_of,
    concurrently,
    list_filters,
    list_params,
    offset_param,
    query_string,
    render,
    router,
    searching,
    signed_in,
)
from evq.worker.errors import InvalidRequest
from evq.worker.ports import SUBJECT_SCAN_CAP
from evq.worker.resolution import Verdict
from evq.worker.states import Status

ALL = "all"
TABS = (ALL, *(str(s) for s in Status))
# Which tabs ask for the rows' latest provider answer (a read of their evidence).
ANSWERED = {ALL, str(Status.UNKNOWN), str(Status.RETRYABLE), str(Status.REJECTED)}
# Where a search box that matches nothing says what it looks at (docs/design.md, "Lists and bulk actions").
SEARCHED = (
    "a step id, a recipient address or @domain, a Message-ID, the provider's message id, "
    "an idempotency key, a run id or an API key's name"
)


# What the step list's address may carry: the tab, the search box, the filters and a page.
STEPS_PARAMS = ("status", "q", *FILTER_KEYS, "offset", "pick")


def statuses_of(tab: str) -> list[str]:
    return [] if tab == ALL else [tab]


async def tab_counts(request: Request, session: Any, filters: dict[str, str | None]) -> dict[str, tuple[int, bool]]:
    """Each tab's count for this search and these filters, as (n, exact): every state's from
    one capped count (count_by_status), and the "all" tab their sum (exact when each is)."""
    counts = await service.count_by_status(app_state(request).store, caller_of(session), filters=searching(filters))
    out = {state: (c.n, c.exact) for state, c in counts.items()}
    out[ALL] = (sum(n for n, _ in out.values()), all(exact for _, exact in out.values()))
    return out


@router.get("/steps", response_class=HTMLResponse)
async def steps(request: Request) -> HTMLResponse:
    session = await signed_in(request)
    params = request.query_params
    tab = params.get("status") or ALL
    filters = list_filters(params)
    offset = 0
    state = app_state(request)
    page: dict[str, Any] = {
        "tab": tab,
        "tabs": TABS,
        "filters": filters,
        "offset": offset,
        "page_size": PAGE_SIZE,
        "query": query_string(filters),
        "searched": SEARCHED,
        "verdicts": list(Verdict),
        "pick_page": params.get("pick") == "page",
    }
    try:
        list_params(params, STEPS_PARAMS)
        page["offset"] = offset = offset_param(params)
        if params.get("pick", "page") != "page":
            raise BadRequest([{"field": "pick", "message": f"page or absent, got {params['pick'][:40]!r}"}])
        if tab not in TABS:
            raise BadRequest([{"field": "status", "message": f"one of {', '.join(TABS)}, got {tab[:40]!r}"}])
        # The page and the tabs' counts are two reads of their own (each its own snapshot, as
        # before): read at once, on two connections, a big search's page takes the longer of
        # the two rather than their sum (docs/design.md, "Search").
        listed, counted = await concurrently(
            service.list_steps(
                state.store,
                caller_of(session),
                statuses=statuses_of(tab),
                filters=searching(filters),
                limit=PAGE_SIZE,
                offset=offset,
                unresolvable=state.policy.unresolvable,
            ),
            tab_counts(request, session, filters),
        )
        reply, counts = listed, counted
    except InvalidRequest as exc:
        empty = {"rows": [], "facts": {}, "answers": {}, "total": (0, True), "counts": {}, "actions": []}
        shown = exc if isinstance(exc, BadRequest) else as_bad_request(exc)
        return render(request, "steps.html", session, status=400, error=shown, **page, **empty)
    ids = [r["id"] for r in reply.data]
    answers = await state.store.last_answers(ids) if tab in ANSWERED else {}
    return render(
        request,
        "steps.html",
        session,
        rows=reply.data,
        facts=await state.store.list_facts(ids),
        answers=answers,
        total=(reply.meta["total"], reply.meta["total_exact"]),
        scanned=reply.meta.get("subject_scanned"),
        scan_cap=SUBJECT_SCAN_CAP,
        counts=counts,
        actions=[a for a, states in BULK_ACTIONS.items() if tab == ALL or tab in states] if reply.data else [],
        **page,
    )
