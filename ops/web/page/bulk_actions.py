"""Bulk actions from the step list (close, retry, cancel, approve, deny): a preview of exactly
the rows, their count and the CLI command(s) that do the same; then the action on exactly
those ids, each row on its own and checked as the one-row path checks it, with each row's
result (done, or a conflict and the state the row is in now)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from evq.ops.app import approvals, service
from evq.ops.app.commands import command
from evq.ops.app.service import Selection
from evq.ops.web.page.common import (
    BULK_ACTIONS,
    BULK_MAX,
    app_state,
    caller_of,
    check_preview_seal,
    chosen_verdict,
    cli_equivalent,
    list_filters,
    picked_ids,
    posted,
    preview_seal,
    query_string,
    refusal,
    render,
    resolve,
    router,
    searching,
)
from evq.ops.web.session import Session
from evq.worker.errors import EvqError, InvalidRequest, StateConflict
from evq.worker.keys import Permission
from evq.worker.ports import StepFilter
from evq.worker.resolution import Verdict
from evq.worker.states import Status

ALL = "all"
# Each action's command in the command table (ops/app/commands.py), so the lines shown are its own words and flags.
COMMANDS = {"close": "steps.resolve", "retry": "steps.resolve", "cancel": "steps.cancel"}
COMMANDS |= {"approve": "steps.approve", "deny": "steps.deny"}
FILTER_DESTS = ("run_id", "provider", "older_than", "recipient_domain", "subject")
TO = {"retry": str(Status.RETRYABLE), "cancel": str(Status.REJECTED), "approve": str(Status.PENDING)}
TO["deny"] = str(Status.REJECTED)
# The verdicts the bulk close form offers (steps.html): every verdict but retry.
CLOSE_VERDICTS = tuple(str(v) for v in Verdict if v is not Verdict.RETRY)
SEAL_PURPOSE = "bulk"  # the seal of a /ops/bulk/preview fits /ops/bulk/apply only
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# What a close's resolution reads from a form (common.resolution_of) beyond the verdict and
# note: the bulk form offers none of them, so a preview drops them and its seal holds them empty.
NOT_OFFERED = ("reason", "evidence_url", "provider_message_id")


def sealed_fields(values: dict[str, str], seen: str) -> dict[str, str]:
    """What an apply acts on, as the preview's seal covers it: the action, exactly the ids and
    the states they were seen in, each row's version then (``versions``: its updated_at), the
    verdict and the note (ops/web/session.py, Sessions.seal), and every other field a close's
    resolution reads (empty in a preview), so one added to the apply form is refused rather
    than recorded in the rows' evidence unpreviewed."""
    sealed = {"action": values.get("action") or "", "seen": seen, "versions": values.get("versions") or ""}
    return sealed | {k: values.get(k) or "" for k in ("verdict", "note", *NOT_OFFERED)}


def version_of(updated_at: datetime) -> str:
    """A row's version as a preview's form carries it: its updated_at in whole microseconds
    since the epoch (exact, whatever the zone it was read in). Every change of a step sets it."""
    return str((updated_at - EPOCH) // timedelta(microseconds=1))


def versions_field(rows: list[dict[str, Any]]) -> str:
    """A preview's rows as its apply form's ``versions``: ``id:version,...``, so an apply tells a
    row changed since the preview even when it is back in the state the preview saw (a retried
    row rejected again) and leaves it alone rather than act on it a second time."""
    return ",".join(f"{r['id']}:{version_of(r['updated_at'])}" for r in rows)


def offered(values: dict[str, str]) -> dict[str, str]:
    """A bulk preview's form as the bulk form offers it: without the fields it does not offer."""
    return {k: v for k, v in values.items() if k not in NOT_OFFERED}


def seen_field(rows: list[dict[str, Any]]) -> str:
    """A preview's rows as its apply form's ``seen``: ``id:status,...`` in the preview's order."""
    return ",".join(f"{r['id']}:{r['status']}" for r in rows)


def action_of(values: dict[str, str]) -> str:
    action = values.get("action") or ""
    if action not in BULK_ACTIONS:
        raise InvalidRequest([{"field": "action", "message": f"one of {', '.join(BULK_ACTIONS)}"}])
    return action


def note_of(values: dict[str, str]) -> str:
    note = (values.get("note") or "").strip()
    if not note:
        raise InvalidRequest(
            [{"field": "note", "message": "required: say what you checked and why (kept in every row's evidence)"}]
        )
    return note


def statuses(action: str, tab: str) -> tuple[str, ...]:
    """The states the action applies to, within the list's chosen tab."""
    return tuple(s for s in BULK_ACTIONS[action] if tab in (ALL, s))


def cli_commands(action: str, ids: list[int], values: dict[str, str], filters: dict[str, Any]) -> list[dict[str, str]]:
    """The CLI that does the same as this preview: a loop over exactly its ids; for a close
    also the filter form, which selects again when it runs (the same filter, as of now)."""
    note = values.get("note", "").strip()
    verdict = {"close": values.get("verdict") or None, "retry": "retry"}
    extra = {"verdict": verdict[action]} if action in verdict else {}
    one = looped(COMMANDS[action], note=note, **extra)
    out = [{"label": "exactly these rows", "command": f"for id in {' '.join(map(str, ids))}; do {one}; done"}]
    if action == "close" and values.get("scope") != "picked":
        chosen = {k: filters.get(k) for k in FILTER_DESTS}
        same = cli_equivalent(
            "steps.resolve", statuses=["unknown"], search=filters.get("q"), **chosen, **extra, note=note
        )
        out.append({"label": "the same filter, as of now", "command": same})
    return out


def looped(path: str, **values: Any) -> str:
    """The command for one id of the loop: its words, then the loop's "$id" where STEP_ID goes
    (the first argument), then the options, quoted. No textual placeholder is swapped, so a
    note holding any word stays as typed."""
    head = " ".join(["evq", *command(path).words.split()])
    line = cli_equivalent(path, **values)
    assert line.startswith(head)  # the table's words are plain: shlex.quote leaves them
    return f'{head} "$id"{line[len(head) :]}'


async def may_act(request: Request, session: Session) -> None:
    """Only an operator or admin acts in bulk: an agent key's session has no bulk form, and
    one it forges is refused here before anything is read (E_AUTH_FAILED, 403)."""
    await caller_of(session).identify(app_state(request).store, Permission.RESOLVE)


async def preview_rows(
    request: Request, session: Session, action: str, tab: str, values: dict[str, str], filters: dict[str, Any]
) -> tuple[list[dict[str, Any]], str]:
    """The rows the action would act on now (at most BULK_MAX), and how many match in all, as
    the preview says it: the count the list's index gives ("10,000" or "more than 10,000"), or
    for a retry (only the requeueable rejected rows) "at least N" when more rejected rows match
    than one preview reads."""
    state = app_state(request)
    wanted = statuses(action, tab)
    # The rows the list's boxes picked (only these, whatever the filter), or every row it matches.
    picked = picked_ids(values) if values.get("scope") == "picked" else ()
    if not wanted:
        return [], "0"
    counted = await service.list_steps(
        state.store, caller_of(session), statuses=wanted, filters=searching(filters), limit=BULK_MAX, ids=picked
    )
    total, exact = counted.meta["total"], counted.meta["total_exact"]
    if action not in ("close", "retry"):
        return counted.data, f"{total:,}" if exact else f"more than {total:,}"
    posted_as = {**values, "verdict": "retry"} if action == "retry" else values
    if picked:
        selection = Selection(statuses=wanted, ids=picked, limit=BULK_MAX)
    else:
        selection = Selection(statuses=wanted, filters=searching(filters), limit=BULK_MAX)
    rows = (await resolve(request, session, posted_as, selection, dry_run=True)).data["steps"]
    if action == "close":  # every unknown row the filter matches is one a close would take
        return rows, f"{total:,}" if exact else f"more than {total:,}"
    # A retry's rows are the requeueable among the rejected ones read: all of them when all were read.
    return rows, f"{len(rows):,}" if exact and total <= BULK_MAX else f"at least {len(rows):,}"


@router.post("/bulk/preview", response_class=HTMLResponse)
async def bulk_preview(request: Request) -> HTMLResponse:
    session, values = await posted(request)
    values = offered(values)
    filters = list_filters(values)
    tab = values.get("status") or ALL
    page: dict[str, Any] = {"filters": filters, "tab": tab, "posted": values, "query": query_string(filters)}
    page |= {"bulk_max": BULK_MAX, "action": values.get("action"), "rows": [], "matching": "0"}
    try:
        await may_act(request, session)
        action = action_of(values)
        if action == "close":
            chosen_verdict(values)
        note_of(values)
        rows, matching = await preview_rows(request, session, action, tab, values, filters)
    except EvqError as exc:
        status, shown = refusal(exc)
        return render(request, "bulk_preview.html", session, status=status, error=shown, **page)
    ids = [r["id"] for r in rows]
    page |= {"rows": rows, "matching": matching, "to_status": TO.get(action) or rows[0]["to_status"] if rows else None}
    seen, versions = seen_field(rows), versions_field(rows)
    sealed = sealed_fields(values | {"versions": versions}, seen)
    page |= {"seen": seen, "versions": versions, "seal": preview_seal(request, session, SEAL_PURPOSE, sealed)}
    return render(request, "bulk_preview.html", session, cli=cli_commands(action, ids, values, filters), **page)


def previewed(values: dict[str, str]) -> dict[int, str]:
    """The ids a preview showed and the state each was in then (``seen``: ``id:status,...``)."""
    try:
        seen = dict(item.split(":", 1) for item in values.get("seen", "").split(",") if item.strip())
        ids = {int(i): status for i, status in seen.items()}
        # A step id is a bigint: one outside it is no preview's (and would overflow the query).
        if not ids or len(ids) > BULK_MAX or not all(1 <= i <= 2**63 - 1 for i in ids):
            raise ValueError
    except ValueError:
        raise InvalidRequest([{"field": "seen", "message": f"1 to {BULK_MAX} step ids from a preview"}]) from None
    return ids


def within_action(action: str, values: dict[str, str], seen: dict[int, str]) -> None:
    """Refuse, before anything changes, an apply the bulk form could not have previewed: a
    ``seen`` state outside the action's states (BULK_ACTIONS), or a close with a verdict the form
    does not offer (retry: the dead-letter retry is its own action, on rejected rows only)."""
    allowed = BULK_ACTIONS[action]
    outside = sorted({state for state in seen.values() if state not in allowed})
    if outside:
        message = f"a {action} applies to {', '.join(allowed)} rows only, not {', '.join(outside)}"
        raise InvalidRequest([{"field": "seen", "message": message}])
    if action == "close" and values.get("verdict") not in CLOSE_VERDICTS:
        raise InvalidRequest([{"field": "verdict", "message": f"one of {', '.join(CLOSE_VERDICTS)}"}])


def sealed_versions(values: dict[str, str]) -> dict[int, str]:
    """The ``versions`` of a sealed apply form (checked by its seal): each id's version then."""
    try:
        pairs = (item.split(":", 1) for item in values.get("versions", "").split(",") if item.strip())
        return {int(i): version for i, version in pairs}
    except ValueError:
        raise InvalidRequest([{"field": "versions", "message": "the versions of a preview's rows"}]) from None


async def changed_since(request: Request, seen: dict[int, str], versions: dict[int, str]) -> list[dict[str, Any]]:
    """The previewed rows someone else changed since (their state is not the one previewed, or
    they changed and came back to it: their version is not the preview's): each a conflict,
    left alone, so a bulk action only ever does what its preview showed, and once."""
    now, _ = await app_state(request).store.list_steps(StepFilter(ids=tuple(seen), limit=None))
    current = {r.id: (str(r.status), version_of(r.updated_at)) for r in now}
    out = []
    for step_id, was in seen.items():
        is_now, version = current.get(step_id, ("gone", None))
        if is_now != was or version != versions.get(step_id):
            again = " again" if is_now == was else ""
            error = StateConflict(
                f"step {step_id} was {was} in the preview and is {is_now}{again} now: someone else changed it",
                hint=f"`evq steps show {step_id}` shows who changed it and when",
                context={"id": step_id, "status": is_now},
            )
            out.append({"id": step_id, "outcome": "failed", "error": error.to_dict()})
    return out


async def apply_each(
    request: Request, session: Session, action: str, ids: tuple[int, ...], note: str
) -> list[dict[str, Any]]:
    """Approve, deny or cancel each id on its own, as its one-row command does (who may, the
    state it must be in, the key that enqueued it never approving it)."""
    store, who = app_state(request).store, caller_of(session)
    act = {"approve": approvals.approve, "deny": approvals.deny, "cancel": approvals.cancel}[action]
    results = []
    for step_id in ids:
        try:
            done = (await act(store, who, step_id, note=note)).data
            results.append({"id": step_id, "outcome": "succeeded", **done})
        except EvqError as exc:
            results.append({"id": step_id, "outcome": "failed", "error": exc.to_dict()})
    return results


@router.post("/bulk/apply", response_class=HTMLResponse)
async def bulk_apply(request: Request) -> HTMLResponse:
    session, values = await posted(request)
    filters = list_filters(values)
    tab = values.get("status") or ALL
    page: dict[str, Any] = {"filters": filters, "tab": tab, "query": query_string(filters), "posted": values}
    try:
        await may_act(request, session)
        action = action_of(values)
        if action == "close":
            chosen_verdict(values)
        note = note_of(values)
        seen = previewed(values)
        within_action(action, values, seen)
        # The last check before anything is read or changed: exactly what a preview showed.
        fields = sealed_fields(values, values.get("seen", ""))
        check_preview_seal(request, session, SEAL_PURPOSE, fields, values.get("seal"))
        conflicts = await changed_since(request, seen, sealed_versions(values))
        ids = tuple(i for i in seen if i not in {c["id"] for c in conflicts})
        if not ids:
            results: list[dict[str, Any]] = []
        elif action in ("close", "retry"):
            posted_as = {**values, "verdict": "retry"} if action == "retry" else values
            selection = Selection(statuses=BULK_ACTIONS[action], ids=ids)
            results = (await resolve(request, session, posted_as, selection)).data["results"]
        else:
            results = await apply_each(request, session, action, ids, note)
    except EvqError as exc:
        status, shown = refusal(exc)
        return render(request, "bulk_preview.html", session, status=status, error=shown, rows=[], **page)
    results = await with_state_now(request, tuple(seen), [*results, *conflicts])
    return render(request, "bulk_done.html", session, action=action, results=results, **page)


async def with_state_now(request: Request, ids: tuple[int, ...], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each previewed id's result in the preview's order, a failed row with the state it is in
    now (someone else changed it), and an id no longer there said so (pruned since)."""
    by_id = {r["id"]: r for r in results}
    failed = [i for i in ids if by_id.get(i, {}).get("outcome") != "succeeded"]
    now, _ = await app_state(request).store.list_steps(StepFilter(ids=tuple(failed), limit=None)) if failed else ([], 0)
    current = {r.id: r for r in now}
    out = []
    for i in ids:
        r = by_id.get(i) or {
            "id": i,
            "outcome": "failed",
            "error": StateConflict(f"step {i} is no longer there", context={"id": i}).to_dict(),
        }
        if i in current:
            r = {**r, "status_now": str(current[i].status), "reason_now": current[i].reason}
        out.append(r)
    return out
