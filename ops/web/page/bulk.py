"""Closing many unknown rows: a preview of exactly the rows and their count, then the close of exactly those rows."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app.service import Selection
from evq.ops.web.page.bulk_actions import changed_since, may_act, sealed_versions, versions_field
from evq.ops.web.page.common import (
    BULK_MAX,
    check_preview_seal,
    chosen_verdict,
    filters_of,
    picked_ids,
    posted,
    preview_seal,
    query_string,
    refusal,
    render,
    resolve,
    router,
)
from evq.worker.errors import AuthFailed, InvalidRequest
from evq.worker.states import Status

SEAL_PURPOSE = "unknown-close"  # the seal of a /ops/unknown/preview fits /ops/unknown/close only
# The close's own fields the preview form posts back (preview.html), all under its seal.
CLOSE_FIELDS = ("verdict", "note", "reason", "evidence_url", "provider_message_id")


def sealed_fields(values: dict[str, str], ids: str) -> dict[str, str]:
    """What a close acts on, as the preview's seal covers it: exactly the ids, each row's version
    then (``versions``, bulk_actions.versions_field) and the close's fields."""
    return {"ids": ids, "versions": values.get("versions") or ""} | {k: values.get(k) or "" for k in CLOSE_FIELDS}


async def came_back(request: Request, ids: tuple[int, ...], versions: dict[int, str]) -> list[dict[str, Any]]:
    """The previewed rows unknown again but not the preview's (requeued, sent and lost again
    since): each a conflict, left alone, so a close posted again never judges a new attempt by
    the note written about the one the preview showed. A row in another state now is
    service.resolve's conflict, as before (bulk_actions.changed_since's other conflicts)."""
    unknown = str(Status.UNKNOWN)
    conflicts = await changed_since(request, dict.fromkeys(ids, unknown), versions)
    return [c for c in conflicts if c["error"]["context"]["status"] == unknown]


@router.post("/unknown/preview", response_class=HTMLResponse)
async def bulk_preview(request: Request) -> HTMLResponse:
    session, values = await posted(request)
    filters = filters_of(values)
    page = {"filters": filters, "posted": values, "query": query_string(filters), "bulk_max": BULK_MAX}
    try:
        await may_act(request, session)  # a preview too: bulk is an operator's or admin's tool
        chosen_verdict(values)
        # The rows the list's boxes picked, or (only when asked for by name) every row the filter matches.
        if values.get("scope") == "picked":
            selection = Selection(statuses=(str(Status.UNKNOWN),), ids=picked_ids(values), limit=BULK_MAX)
        else:
            selection = Selection(statuses=(str(Status.UNKNOWN),), filters=filters, limit=BULK_MAX)
        reply = await resolve(request, session, values, selection, dry_run=True)
    except (InvalidRequest, AuthFailed) as exc:
        status, shown = refusal(exc)
        return render(request, "preview.html", session, status=status, error=shown, rows=[], **page)
    ids = ",".join(str(r["id"]) for r in reply.data["steps"])
    versions = versions_field(reply.data["steps"])
    seal = preview_seal(request, session, SEAL_PURPOSE, sealed_fields(values | {"versions": versions}, ids))
    return render(
        request,
        "preview.html",
        session,
        ids=ids,
        versions=versions,
        seal=seal,
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
        await may_act(request, session)  # an agent's forged close is E_AUTH_FAILED, as before any seal
        chosen_verdict(values)
        check_preview_seal(
            request, session, SEAL_PURPOSE, sealed_fields(values, values.get("ids", "")), values.get("seal")
        )
        conflicts = await came_back(request, ids, sealed_versions(values))
        left = tuple(i for i in ids if i not in {c["id"] for c in conflicts})
        if left:
            data = (await resolve(request, session, values, Selection(statuses=(str(Status.UNKNOWN),), ids=left))).data
        else:
            data = {"succeeded": 0, "failed": 0, "not_attempted": 0, "results": []}
        data = {**data, "failed": data["failed"] + len(conflicts), "results": [*data["results"], *conflicts]}
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
    return render(request, "closed.html", session, d=data, filters=filters, query=query_string(filters))
