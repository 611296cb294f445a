"""Reading steps back: steps list and show (a step's detail, evidence, verdict and content as each
role may see it) and runs show."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from evq.ops.app.labels import REASON_LABELS, STATUS_LABELS, label, with_labels
from evq.ops.app.service.common import _DURATION, _UNITS, MAX_DURATION, Caller, Reply, page_meta, verdict_view
from evq.ops.app.service.enqueue import approval_view
from evq.ops.app.service.feeds import DELIVERIES_SHOWN, delivery_view, public_deliveries
from evq.worker.domains import unicode_domain
from evq.worker.errors import (
    InvalidRequest,
)
from evq.worker.keys import Permission
from evq.worker.outcomes import refused_recipients
from evq.worker.ports import AppStore, StatusCount, StepFilter
from evq.worker.records import StepDetail, StepSummary
from evq.worker.search import SEARCH_MAX, SUBJECT_MAX
from evq.worker.states import Status
from evq.worker.timeline import run_events

# -- reading back -------------------------------------------------------------


def parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise InvalidRequest(
            [{"field": "--older-than", "message": f"expected a duration like 30m, 2h or 3d, got {text[:40]!r}"}]
        )
    duration = timedelta(seconds=int(match[1]) * _UNITS[match[2]])
    if duration > MAX_DURATION:
        raise InvalidRequest([{"field": "--older-than", "message": f"at most {MAX_DURATION.days}d, got {text[:40]!r}"}])
    return duration


def step_filter(now: datetime, statuses: Sequence[str], filters: Mapping[str, Any], **paging: Any) -> StepFilter:
    """The filter as of ``now``: relative filters are fixed once, at the start."""
    older_than = filters.get("older_than")
    try:
        wanted = tuple(Status(s) for s in statuses)
    except ValueError:
        raise InvalidRequest(
            [{"field": "--status", "message": f"one of {', '.join(Status)}, got {', '.join(map(str, statuses))[:80]}"}]
        ) from None
    return StepFilter(
        statuses=wanted,
        run_id=filters.get("run_id"),
        provider=filters.get("provider"),
        created_before=now - parse_duration(older_than) if older_than else None,
        # Addresses are stored with Unicode domains; an operator may paste the xn-- form from a log.
        recipient_domain=unicode_domain(filters["recipient_domain"]) if filters.get("recipient_domain") else None,
        search=search_text(filters.get("search")),
        subject=subject_text(filters.get("subject")),
        **paging,
    )


def search_text(raw: str | None) -> str | None:
    """The search box's string, trimmed; None when there is nothing to search for."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if len(text) > SEARCH_MAX:
        raise InvalidRequest([{"field": "--search", "message": f"at most {SEARCH_MAX} characters, got {len(text)}"}])
    return text


def subject_text(raw: str | None) -> str | None:
    """The subject filter's string, trimmed; None when there is nothing to look for."""
    if raw is None or not raw.strip():
        return None
    text = raw.strip()
    if len(text) > SUBJECT_MAX:
        raise InvalidRequest([{"field": "--subject", "message": f"at most {SUBJECT_MAX} characters, got {len(text)}"}])
    return text


def summary(
    r: StepSummary, delivery: Mapping[str, Any] | None = None, *, unresolvable: Collection[str] | None = None
) -> dict[str, Any]:
    return {
        "id": r.id,
        "run_id": r.run_id,
        "step_id": r.step_id,
        "status": str(r.status),
        "status_label": label(STATUS_LABELS, str(r.status)),
        "reason": r.reason,
        "reason_label": label(REASON_LABELS, r.reason),
        "provider": r.provider,
        "attempts": r.attempts,
        "recipients": r.recipients,
        "subject": r.subject,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "unknown_since": r.unknown_since,
        "closed_at": r.closed_at,
        # A duration: whole seconds (the contract's numbers are integers unless a unit needs fractions).
        "age_seconds": int(r.age_seconds),
        "delivery": delivery_view(delivery),
        **verdict_view(
            str(r.status),
            r.reason,
            maybe_delivered=r.maybe_delivered,
            provider=r.provider,
            unresolvable=unresolvable,
            unknown_since=r.unknown_since,
        ),
    }


async def list_steps(
    store: AppStore,
    caller: Caller,
    *,
    statuses: Sequence[str] = (),
    filters: Mapping[str, Any] | None = None,
    limit: int = 50,
    offset: int = 0,
    now: datetime | None = None,
    unresolvable: Collection[str] | None = None,
    ids: tuple[int, ...] = (),
) -> Reply:
    """Steps, unknown ones oldest first (the operator's queue), the rest newest first; each
    with its verdict (``unresolvable``: :func:`verdict_view`). ``ids``: only these (the rows a
    list's boxes picked)."""
    now = now or datetime.now(UTC)
    where = step_filter(now, statuses, filters or {}, limit=limit, offset=offset, ids=ids)
    await caller.identify(store, Permission.READ)
    scanned: dict[str, Any] = {}
    if where.subject is not None:
        found = await store.list_by_subject(where, now=now)
        rows, total = found.rows, found.total(where.statuses)
        # A cut scan's total is "at least": the older steps were not searched.
        scanned = {"subject_scanned": found.scanned, **({"total_exact": False} if found.cut else {})}
    else:
        rows, total = await store.list_steps(where, now=now)
    states = await store.delivery_states([r.id for r in rows])
    data = [summary(r, states.get(r.id), unresolvable=unresolvable) for r in rows]
    return Reply(data, {**page_meta(data, total, limit=limit, offset=offset), **scanned})


async def count_by_status(
    store: AppStore,
    caller: Caller,
    *,
    filters: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, StatusCount]:
    """Each state's count of the steps the filters match (the ops page's tabs), capped at
    COUNT_CAP each (StatusCount.exact false: more)."""
    now = now or datetime.now(UTC)
    where = step_filter(now, (), filters or {})
    await caller.identify(store, Permission.READ)
    return await store.count_by_status(where)


_HIDDEN = ("lease_token",)


def public_step(step: Mapping[str, Any]) -> dict[str, Any]:
    out = with_labels({k: v for k, v in step.items() if k not in _HIDDEN})
    if out.get("age_seconds") is not None:
        out["age_seconds"] = int(out["age_seconds"])
    return out


def public_evidence(row: Mapping[str, Any]) -> dict[str, Any]:
    """An evidence row as every interface shows it: its reason labelled, its latency whole
    milliseconds (the row keeps the measured value)."""
    out = with_labels(row)
    if out.get("latency_ms") is not None:
        out["latency_ms"] = round(out["latency_ms"])
    return out


async def show_step(
    store: AppStore, caller: Caller, step_id: int, *, unresolvable: Collection[str] | None = None
) -> Reply:
    """One step, the decision behind it, and every evidence row in order; the message's
    text and html only to a caller whose role sees content (``content`` says which); the
    step's verdict (safe_to_retry, next_action: :func:`verdict_view`)."""
    await caller.identify(store, Permission.READ)
    detail = await store.get_step(step_id)
    refusal = await caller.content_refusal(store)
    deliveries, _ = await store.delivery_events(step=step_id, limit=DELIVERIES_SHOWN)
    states = await store.delivery_states([step_id])
    data = {
        **_step_detail(detail, refusal, states.get(step_id), unresolvable),
        "deliveries": public_deliveries(deliveries),
    }
    return Reply(data)


def _step_detail(
    detail: StepDetail,
    refusal: str | None,
    delivery: Mapping[str, Any] | None,
    unresolvable: Collection[str] | None,
) -> dict[str, Any]:
    """One stored step as show_step and show_steps answer it: the step (its content left out
    when ``refusal`` says this caller may not see it), its decision and its evidence."""
    step = {
        **public_step(detail.step),
        "refused_recipients": accepted_refusals(detail.step, detail.evidence),
        "content": content_view(detail.step, refusal),
        "delivery": delivery_view(delivery),
        **step_verdict(detail.step, unresolvable),
        "approval": approval_view(detail.step["id"], str(detail.step["status"]), detail.step.get("hold_expires_at")),
    }
    if refusal is not None:
        step["payload"] = {**step["payload"], **dict.fromkeys(BODY_PARTS)}
    return {"step": step, "decision": detail.decision, "evidence": [public_evidence(e) for e in detail.evidence]}


async def show_steps(
    store: AppStore, caller: Caller, step_ids: Sequence[int], *, unresolvable: Collection[str] | None = None
) -> Reply:
    """show_step of several steps (the held queue's page) in a fixed number of reads, not a
    few per step: each as show_step's ``step``, ``decision`` and ``evidence``, in the ids'
    order; a step no longer stored (pruned since its id was read) is left out. No
    ``deliveries`` list (each step's events are a read of their own; its ``delivery`` state is
    there): a page that shows the events reads them with show_step."""
    await caller.identify(store, Permission.READ)
    details = await store.get_steps(step_ids)
    refusal = await caller.content_refusal(store)
    states = await store.delivery_states([d.step["id"] for d in details]) if details else {}
    return Reply([_step_detail(d, refusal, states.get(d.step["id"]), unresolvable) for d in details])


def step_verdict(step: Mapping[str, Any], unresolvable: Collection[str] | None) -> dict[str, Any]:
    """:func:`verdict_view` of a stored step's row (steps show, runs show)."""
    return verdict_view(
        str(step["status"]),
        step.get("reason"),
        maybe_delivered=bool(step.get("maybe_delivered")),
        provider=step.get("provider"),
        unresolvable=unresolvable,
        unknown_since=step.get("unknown_since"),
    )


# The parts of a payload that are the message's content (worker/content_retention.py removes them).
BODY_PARTS = ("text", "html")


def _digest(value: str | None) -> dict[str, Any] | None:
    # As evq_redact_batch computes it (migrations/baseline/prune.sql): the UTF-8 bytes' length and SHA-256.
    if value is None:
        return None
    raw = value.encode()
    return {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def content_view(step: Mapping[str, Any], refusal: str | None) -> dict[str, Any]:
    """What the reply says about the message's content: whether it is still stored
    (``redacted``: retention removed it), whether this reply holds it (``shown``) and
    why not, and each body part's size and SHA-256 either way (the proof that stays)."""
    payload = step["payload"]
    marker = payload.get("content_redacted")
    redacted = step.get("content_redacted_at") is not None or marker is not None
    parts = marker["parts"] if marker else {name: _digest(payload.get(name)) for name in BODY_PARTS}
    if redacted:
        withheld, note = "retention", "removed by retention (EVQ_KEEP_CONTENT) after the step closed"
    elif refusal is not None:
        withheld, note = "role", refusal
    else:
        withheld, note = None, None
    return {
        "redacted": redacted,
        "redacted_at": step.get("content_redacted_at") or (marker or {}).get("at"),
        "shown": withheld is None,
        "withheld": withheld,
        "note": note,
        "parts": {name: parts.get(name) for name in BODY_PARTS},
        "payload_sha256": step["payload_sha256"],
    }


def accepted_refusals(step: Mapping[str, Any], evidence: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The recipients refused by the answer that accepted this step (a partial refusal).

    Read from that answer's evidence, the one record of what the server said; an
    accepted step's status never changes again, so neither does this list."""
    if step.get("status") != "accepted":
        return []
    for row in reversed(evidence):
        if row.get("outcome") == "accepted" and row.get("kind") in ("provider_response", "late_response"):
            return refused_recipients(row.get("detail"))
    return []


RUN_STEP_FIELDS = (
    "id",
    "step_id",
    "status",
    "reason",
    "provider",
    "attempts",
    "max_attempts",
    "idempotency_key",
    "message_id",
    "provider_message_id",
    "created_at",
    "unknown_since",
    "closed_at",
)


async def show_run(
    store: AppStore,
    caller: Caller,
    run_id: str,
    *,
    limit: int = 50,
    offset: int = 0,
    unresolvable: Collection[str] | None = None,
) -> Reply:
    """A page of one run's steps (in step_id order) and their chain in time order: decisions,
    actions, attempts, answers, operator closes. Paged as `steps list` is (limit, offset,
    meta.total counted up to COUNT_CAP), so a run of any size answers in bounded time."""
    await caller.identify(store, Permission.READ)
    detail = await store.get_run(run_id, limit=limit, offset=offset)
    states = await store.delivery_states([s["id"] for s in detail.steps])
    data = {
        "run_id": detail.run_id,
        "steps": [
            with_labels(
                {
                    **{k: s[k] for k in RUN_STEP_FIELDS},
                    "delivery": delivery_view(states.get(s["id"])),
                    **step_verdict(s, unresolvable),
                }
            )
            for s in detail.steps
        ],
        "events": [public_evidence(e) for e in run_events(detail.steps, detail.decisions, detail.evidence)],
    }
    meta = page_meta(data["steps"], detail.total, limit=limit, offset=offset)
    return Reply(data, {**meta, "events": len(data["events"])})
