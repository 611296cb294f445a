"""The application layer: what every interface does, in one place.

The CLI (ops/cli), the HTTP API and the ops page (ops/web) and the MCP server
(ops/mcp/server.py) all call these functions with a store and plain parameters, and
get back a :class:`Reply` (the contract's ``data``, ``meta`` and ``status``) or an
:class:`~worker.errors.EvqError`. Which key role an operation needs is decided here,
so no interface can grant more than another.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from evq.ops.app.labels import NEXT_ACTION_LABELS, REASON_LABELS, STATE_LABELS, STATUS_LABELS, label, with_labels
from evq.ops.app.longwork import Tally, each
from evq.ops.settings import ADAPTERS, Settings
from evq.worker import metrics
from evq.worker.approval import gated
from evq.worker.delivery import DELIVERY_TYPES, DeliveryEvent
from evq.worker.enqueue import (
    ambiguity,
    answer_held,
    existing_or_conflict,
    flag_ambiguity,
    merge_answers,
    must_look_up,
    refuse_unresolvable,
    validate,
    validate_many,
)
from evq.worker.errors import (
    AuthFailed,
    BudgetExceeded,
    Forbidden,
    IdempotencyConflict,
    InvalidRequest,
    NotFound,
    StateConflict,
    Unresolvable,
)
from evq.worker.keys import ALLOWED, CLI_KEY_SOURCE, Identity, Permission, Role, authenticate, authorize
from evq.worker.logs import get_logger
from evq.worker.outcomes import refused_recipients
from evq.worker.ports import COUNT_CAP, AppStore, KeyLookup, StatusCount, StepFilter
from evq.worker.ports.providers import ProviderProfile
from evq.worker.ratelimit import RateLimit
from evq.worker.records import AMBIGUITY_HINTS, EnqueueResult, StepDetail, StepSummary
from evq.worker.refusals import INTERFACES, describe
from evq.worker.request import Actor, Policy, ValidRequest, unicode_domain
from evq.worker.resolution import Resolution, Verdict, requeueable
from evq.worker.search import SEARCH_MAX
from evq.worker.states import Status
from evq.worker.timeline import run_events
from evq.worker.verdict import verdict

log = get_logger("evq.service")
_T = TypeVar("_T")

# The request's fields as every interface describes them: (field, repeatable, description).
REQUEST_FIELDS: tuple[tuple[str, bool, str], ...] = (
    ("run_id", False, "The agent run this send belongs to (required)."),
    ("step_id", False, "The step within the run; unique per run (required)."),
    ("to", True, "Recipient, 'addr' or 'Name <addr>'; repeat for more (at least one)."),
    ("cc", True, "Cc recipient; repeatable."),
    ("bcc", True, "Bcc recipient (envelope only); repeatable."),
    ("from", False, "Sender (default: EVQ_DEFAULT_FROM)."),
    ("reply_to", True, "Reply-To address; repeatable."),
    ("subject", False, "Subject line (one line)."),
    ("text", False, "Plain-text body."),
    ("html", False, "HTML body."),
    ("intent", False, "What the agent meant to achieve by this send."),
    ("notify", False, "Address told if the send ends rejected."),
    ("idempotency_key", False, "Key for this send (default: RUN_ID:STEP_ID)."),
    ("provider", False, "Adapter to send through (default: the first of EVQ_ADAPTER)."),
)
DECISION_FIELDS: tuple[tuple[str, str], ...] = (
    ("instruction_version", "Version of the instructions the agent followed."),
    ("prompt_version", "Version of the prompt."),
    ("model", "Model that made the decision."),
    ("tool", "Tool the agent chose."),
    ("rationale", "Why: short text, or a JSON object."),
    ("decided_at", "When the agent decided (ISO 8601 with zone)."),
)
HEADERS_HELP = "Allowed header (In-Reply-To, References, ...); repeatable."
MAX_ATTEMPTS_HELP = "Attempts for this step (default: 1000, a backstop: EVQ_RETRY_FOR decides first)."
REQUIRE_APPROVAL_HELP = (
    "Hold this send until a person approves it (status held; `evq steps approve`), whatever the policy."
)
SEND_AT_HELP = (
    "Send no earlier than this instant: ISO 8601 with an offset (2026-05-01T09:00:00+02:00), at most 365 "
    "days ahead; a past one is now."
)
PRIORITY_HELP = "high, normal (the default) or low: a higher priority is claimed first (a code before a newsletter)."

# The filters `steps list` and bulk `steps resolve` share: (name, metavar, description).
FILTERS: tuple[tuple[str, str | None, str], ...] = (
    ("run_id", None, "Only this run."),
    ("provider", None, "Only this provider."),
    ("older_than", "30m|2h|3d", "Only rows older than this (unknown rows: since they became unknown)."),
    ("recipient_domain", None, "Only rows with a recipient at this domain."),
    (
        "search",
        "TEXT",
        "Only rows this finds: a step id, a recipient (bob@example.com, or a domain: @example.com or "
        "example.com), a Message-ID (with or without <>), the provider's message id, an idempotency "
        f"key, a run id, or the name of the API key that enqueued it. At most {SEARCH_MAX} characters.",
    ),
)
# The filters whose length the service bounds (search_text): the command table states it to
# every interface (the JSON schemas' maxLength, the HTTP query's bound, the CLI's help).
FILTER_MAX_LENGTH: dict[str, int] = {"search": SEARCH_MAX}
# The filters' names: the keyword each interface passes them under (a command's dest).
FILTER_NAMES = tuple(name for name, _, _ in FILTERS)
LIST_LIMIT_MAX = 1000
MAX_ID = 2**63 - 1  # a step id is a bigint; so are LIMIT and OFFSET

_DURATION = re.compile(r"^(\d{1,9})\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Older than a century is older than any row; longer ones would not fit a date (now - 3000 years).
MAX_DURATION = timedelta(days=36500)


@dataclass(frozen=True, slots=True)
class Reply:
    """One operation's answer: the contract's ``data``, ``meta`` (less the duration) and ``status``."""

    data: Any
    meta: dict[str, Any] = field(default_factory=dict)
    status: str = "success"
    created: bool | None = None  # enqueue: whether any step was created (HTTP 201 rather than 200)


class Caller:
    """Who is asking: the key they presented (maybe none) and where they present it.

    ``trusted_reader``: the command line reads without a key (whoever runs it can reach
    the database); the HTTP API and MCP server need one for every call. The verified
    identity is kept for the caller's lifetime (one request, one command), so a call
    that checks twice reads the key once.
    """

    def __init__(
        self,
        key: str | None,
        *,
        source: str = CLI_KEY_SOURCE,
        trusted_reader: bool = False,
        interface: str = "cli",
    ):
        self.key = key or None
        self.source = source
        self.trusted_reader = trusted_reader
        self.interface = interface  # recorded with what the caller enqueues (cli, http, mcp, ops-page)
        self._identity: Identity | None = None

    @classmethod
    def signed_in(cls, identity: Identity, *, source: str, interface: str = "ops-page") -> Caller:
        """A caller whose key was verified earlier (the ops page's session); roles still apply."""
        caller = cls(None, source=source, interface=interface)
        caller._identity = identity
        return caller

    async def verified(self, lookup: KeyLookup) -> Identity | None:
        """The identity behind the key if it is valid (whatever its role); None otherwise. Never raises
        for a bad key: used to name who asked, never to grant anything."""
        if self._identity is not None:
            return self._identity
        if not self.key:
            return None
        try:
            return await authenticate(lookup, self.key, Permission.READ, source=self.source)
        except AuthFailed:
            return None

    async def identify(self, lookup: KeyLookup, permission: Permission) -> Identity | None:
        """The identity allowed to do ``permission``; None for a trusted reader's read. AuthFailed otherwise."""
        if permission is Permission.READ and self.trusted_reader:
            return None
        if self._identity is None:
            self._identity = await authenticate(lookup, self.key, permission, source=self.source)
            return self._identity
        return authorize(self._identity, permission)

    async def content_refusal(self, lookup: KeyLookup) -> str | None:
        """None when this caller may see a message's text and html; otherwise why not.

        A key that is not valid is an error (the caller meant to use it); a valid key
        whose role may not see content, or no key, only withholds the content."""
        if self._identity is None and self.key is None:
            return f"no API key: message content is shown only to keys with role {_CONTENT_ROLES}"
        try:
            await self.identify(lookup, Permission.READ_CONTENT)
        except Forbidden as exc:
            role = (exc.context or {}).get("role", "another role")
            return f"the key's role ({role}) does not see message content; roles {_CONTENT_ROLES} do"
        return None

    async def key_holder(self, lookup: KeyLookup) -> Identity | None:
        """Whose key this is, checked even for a trusted reader (a feed is per key); None:
        a trusted reader without a key. AuthFailed for a wrong key or none where one is needed."""
        if self._identity is None and (self.key is not None or not self.trusted_reader):
            self._identity = await authenticate(lookup, self.key, Permission.READ, source=self.source)
        return self._identity


_CONTENT_ROLES = " or ".join(str(r) for r in ALLOWED[Permission.READ_CONTENT])


# -- enqueue ------------------------------------------------------------------


def validate_requests(requests: Sequence[Any], policy: Policy) -> list[ValidRequest]:
    """Every request checked before anything is written: one bad request writes nothing."""
    if not requests:
        raise InvalidRequest([{"field": "$", "message": "no request given"}])
    return validate_many(requests, policy) if len(requests) > 1 else [validate(requests[0], policy)]


async def enqueue(
    store: AppStore,
    caller: Caller,
    requests: Sequence[Any],
    policy: Policy,
    *,
    many: bool = False,
    dry_run: bool = False,
    interface: str | None = None,
) -> Reply:
    """Enqueue one request (``many=False``: data is the step) or many in one transaction
    (data is a list). A dry run is a read: it says what would happen to each.

    ``interface`` (http, mcp, cli): a refusal is recorded (:func:`record_refusal`) before
    the error is raised; None for a caller that recorded it already (the CLI validates
    before it opens the store)."""
    try:
        valid = validate_requests(requests, policy)
    except InvalidRequest as exc:
        if interface is not None:
            await record_refusal(store, caller, interface, requests, exc, dry_run=dry_run)
        raise
    if dry_run:
        # The key budgets count per key, and its approval holds or not: a dry run's verdict is
        # for the key that asked (the command line reads without one, so its key, if valid, too).
        who = await caller.identify(store, Permission.READ) or await caller.verified(store)
        actor = actor_of(caller, who) if who else None
        plan = [await _plan(store, replace(v, actor=actor) if actor else v, policy) for v in valid]
        # The refusal the real run would answer (a new step through an unresolvable provider).
        held = {i for i in must_look_up(valid, policy) if plan[i]["existing_id"] is not None}
        refuse = lambda: refuse_unresolvable(valid, policy, indexed=len(valid) > 1, held=held)  # noqa: E731
        await _recorded(store, caller, interface, requests, refuse, dry_run=True)
        return Reply({"dry_run": True, "plan": plan}, {"count": len(plan)})
    identity = await caller.identify(store, Permission.ENQUEUE)
    assert identity is not None  # ENQUEUE is never granted without a key
    # EVQ_REFUSE_UNRESOLVABLE refuses only what would be created: the requests it concerns are
    # looked up first and never inserted; a held one is answered as its row is.
    rows = {i: await store.find_by_key(valid[i]) for i in must_look_up(valid, policy)}
    answer = lambda: answer_held(valid, rows, policy, indexed=len(valid) > 1)  # noqa: E731
    answered = await _recorded(store, caller, interface, requests, answer, dry_run=False)
    actor = actor_of(caller, identity)
    rest = [replace(v, actor=actor) for i, v in enumerate(valid) if i not in answered]
    try:
        if not rest:
            made = []
        elif len(valid) == 1:
            made = [await store.enqueue(rest[0], approval=policy.approval)]
        else:
            made = await store.enqueue_many(rest, approval=policy.approval)
    except BudgetExceeded as exc:  # EVQ_BUDGET_ACTION=refuse: nothing was written or charged
        if interface is not None:
            await record_refusal(store, caller, interface, requests, exc)
        raise
    # A step whose provider could never settle a lost answer says so (docs/design.md, "Provider profiles").
    results = [flag_ambiguity(r, v, policy) for r, v in zip(merge_answers(answered, made), valid, strict=True)]
    created = sum(1 for r in results if r.created)
    if not many:
        return Reply(enqueued_view(results[0], policy), created=results[0].created)
    data = [enqueued_view(r, policy) for r in results]
    return Reply(data, {"count": len(results), "created": created}, created=created > 0)


def actor_of(caller: Caller, identity: Identity) -> Actor:
    """Who asks, as the enqueue records and judges it: the key's name and public id (never its
    secret), the interface, and the key's approval as read with the key for this call
    (worker/approval.py decides what it holds, the same for every interface)."""
    return Actor(
        interface=caller.interface, key_id=identity.key_id, name=identity.name, approval=str(identity.approval)
    )


def enqueued_view(result: EnqueueResult, policy: Policy) -> dict[str, Any]:
    """An enqueue's answer as every interface shows it: the result, labelled, with the step's
    verdict (a repeat is answered as its row is: a rejected one may say resend) and, held, what
    happens next (:func:`approval_view`)."""
    return with_labels(
        {
            **result.to_dict(),
            **verdict_view(
                str(result.status),
                result.reason,
                maybe_delivered=result.maybe_delivered,
                provider=result.provider,
                unresolvable=policy.unresolvable,
            ),
            "approval": approval_view(result.id, str(result.status), result.hold_expires_at),
        }
    )


# How long one wait may last (ops/app/waiting.py): longer holds a request, and a proxy's idle timer, open too long.
WAIT_MAX = 60.0


def approval_view(step_id: int, status: str, expires_at: datetime | None) -> dict[str, Any] | None:
    """A held step's next steps, for the agent that reads it (the enqueue's answer, `steps
    show`, `steps wait`): who may decide (the roles that approve, never the key that enqueued
    it), until when (then it is rejected, approval_expired), and how to wait for the decision
    on each interface. None: the step is not held."""
    if status != Status.HELD:
        return None
    seconds = f"{WAIT_MAX:g}s"
    return {
        "approver_roles": [str(r) for r in ALLOWED[Permission.APPROVE]],
        "not_approver": "the API key that enqueued it: a second person decides",
        "expires_at": expires_at,
        "on_expiry": "rejected, reason approval_expired: nothing is sent (next_action resend)"
        if expires_at is not None
        else "it never expires (EVQ_APPROVAL_EXPIRES=never)",
        "wait": {
            "cli": f"evq steps wait {step_id} --timeout {seconds}",
            "http": f"GET /v1/steps/{step_id}?wait={seconds}",
            "mcp": {"tool": "evq_steps_wait", "arguments": {"step_id": step_id, "timeout": seconds}},
            "max_seconds": int(WAIT_MAX),
            "returns": "once a person decided: approved, when it is sent (or fails); denied or expired, "
            "rejected. A wait lasts at most max_seconds: meta.timed_out true means nobody decided yet, "
            "call again",
        },
    }


async def _recorded(
    store: AppStore,
    caller: Caller,
    interface: str | None,
    requests: Sequence[Any],
    check: Callable[[], _T],
    *,
    dry_run: bool,
) -> _T:
    """``check()``, its InvalidRequest (E_UNRESOLVABLE) recorded as a refusal (``interface``) before it is raised."""
    try:
        return check()
    except InvalidRequest as exc:
        if interface is not None:
            await record_refusal(store, caller, interface, requests, exc, dry_run=dry_run)
        raise


async def record_refusal(
    store: AppStore,
    caller: Caller,
    interface: str,
    requests: Sequence[Any],
    exc: InvalidRequest,
    *,
    dry_run: bool = False,
) -> int | None:
    """Record a refused enqueue (worker/refusals.py) in a statement of its own; its id.

    Best effort: the refusal is the answer, so a failure to record it (the database away)
    is logged and never replaces that answer (None). The key's name is recorded when the
    caller showed a valid key (any role: a key that may not enqueue is exactly what an
    operator wants to see); otherwise None."""
    try:
        identity = await caller.verified(store)
        refusal = describe(
            interface, requests, exc.errors, key_name=identity.name if identity else None, dry_run=dry_run
        )
        return await store.record_refusal(refusal)
    except Exception as failure:
        log.warning("refusal_not_recorded", interface=interface, error_class=type(failure).__name__)
        return None


async def _plan(store: AppStore, request: ValidRequest, policy: Policy) -> dict[str, Any]:
    """What enqueueing ``request`` would do, read without writing."""
    row = await store.find_by_key(request)
    flag = ambiguity(request, policy)
    plan: dict[str, Any] = {
        "run_id": request.run_id,
        "step_id": request.step_id,
        "idempotency_key": request.idempotency_key,
        "provider": request.provider,
        "action": "create",
        "existing_id": None,
        "request": request.payload,
        "ambiguity": flag,
        "ambiguity_hint": AMBIGUITY_HINTS.get(flag) if flag else None,
        # The existing step is one evq prune removed: answered from the key ledger as it ended.
        "pruned": bool(row and row.get("pruned")),
    }
    if row is None:
        # The policy's verdict on it as a new step, read as the counters stand now: the real
        # enqueue decides under their locks (a concurrent send may use a budget first).
        holds = await store.preview_holds(request, policy.approval) if gated(policy.approval, [request]) else []
        plan["hold"] = {"rules": holds} if holds else None
        # What the step would be: a new one starts pending (wait), or held (wait_for_approval).
        plan.update(
            verdict_view(
                str(Status.HELD if holds else Status.PENDING),
                None,
                maybe_delivered=False,
                provider=request.provider,
                unresolvable=policy.unresolvable,
            )
        )
    else:
        plan["hold"] = row.get("hold")
        try:
            held = flag_ambiguity(existing_or_conflict({**row, "created": False}, request), request, policy)
            # Answered as the row is: the ambiguity of its provider.
            hint = AMBIGUITY_HINTS.get(held.ambiguity) if held.ambiguity else None
            plan.update(action="return_existing", existing_id=row["id"], ambiguity=held.ambiguity, ambiguity_hint=hint)
            # Answered as the row is: its verdict.
            plan.update(
                verdict_view(
                    str(row["status"]),
                    row.get("reason"),
                    maybe_delivered=bool(row.get("maybe_delivered")),
                    provider=row["provider"],
                    unresolvable=policy.unresolvable,
                )
            )
        except IdempotencyConflict:
            # Refused: no step of this request exists or would; nothing to say of it.
            plan.update(action="refuse_conflict", existing_id=row["id"], safe_to_retry=None, next_action=None)
            plan["next_action_label"] = None
    return plan


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


def total_meta(total: int) -> dict[str, Any]:
    """A list's total as the contract states it: counted up to COUNT_CAP (docs/design.md,
    "Search"); ``total_exact`` false: more match than ``total`` says."""
    return {"total": min(total, COUNT_CAP), "total_exact": total <= COUNT_CAP}


def page_meta(rows: Sequence[Any], total: int, *, limit: int | None, offset: int) -> dict[str, Any]:
    """What every list's meta says of its page (cli-schema's list_meta): the rows shown, all
    that match (counted up to COUNT_CAP), the page's size and how many were skipped before it."""
    return {"count": len(rows), **total_meta(total), "limit": limit, "offset": offset}


def verdict_view(
    status: str,
    reason: str | None,
    *,
    maybe_delivered: bool,
    provider: str | None,
    unresolvable: Collection[str] | None,
    unknown_since: datetime | None = None,
) -> dict[str, Any]:
    """The ambiguity contract's fields of one step (worker/verdict.py, docs/design.md "The
    ambiguity contract"): ``safe_to_retry``, ``next_action`` and its label. ``unresolvable``: the
    providers whose profile could never settle a lost answer (Policy.unresolvable, from the
    settings: no database round trip); an unknown step through one needs an operator. None: not
    known, so every provider counts as one (an unknown step says ask_operator, never wait)."""
    resolvable = unresolvable is not None and provider not in unresolvable
    unknown_for = None if unknown_since is None else (datetime.now(UTC) - unknown_since).total_seconds()
    v = verdict(str(status), reason, maybe_delivered=maybe_delivered, resolvable=resolvable, unknown_for=unknown_for)
    return {
        "safe_to_retry": v.safe_to_retry,
        "next_action": v.next_action,
        "next_action_label": label(NEXT_ACTION_LABELS, v.next_action),
    }


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
    rows, total = await store.list_steps(where, now=now)
    states = await store.delivery_states([r.id for r in rows])
    data = [summary(r, states.get(r.id), unresolvable=unresolvable) for r in rows]
    return Reply(data, page_meta(data, total, limit=limit, offset=offset))


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


# The parts of a payload that are the message's content (worker/redactor.py removes them).
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


# -- refused enqueues (worker/refusals.py) -------------------------------------------

REFUSAL_FIELDS = (
    "id",
    "created_at",
    "interface",
    "key_name",
    "dry_run",
    "requests",
    "request_bytes",
    "request_sha256",
    "error_count",
    "reasons",
    "errors",
    "asked",
)


# Who may read another key's feed (or every key's): those who act on other agents' sends.
_FEED_READERS = (Role.OPERATOR, Role.ADMIN)


def _only_its_own(who: Identity, what: str, *, hint: str) -> Forbidden:
    """The refusal of a key that may read only its own ``what`` asking for another key's."""
    return Forbidden(
        f"the API key {who.name!r} has role {who.role}: it reads only its own {what}",
        hint=hint,
        context={"name": who.name, "role": str(who.role), "roles": [str(r) for r in _FEED_READERS]},
    )


async def list_refusals(
    store: AppStore,
    caller: Caller,
    *,
    key_name: str | None = None,
    interface: str | None = None,
    before_id: int | None = None,
    limit: int = 50,
    offset: int = 0,
) -> Reply:
    """Refused enqueues, newest first: what was asked (identifiers only), by which key, every failing field;
    ``offset`` of them skipped (meta.total counts every one the filters match)."""
    if interface is not None and interface not in INTERFACES:
        raise InvalidRequest(
            [{"field": "--interface", "message": f"one of {', '.join(INTERFACES)}, got {interface[:40]!r}"}]
        )
    who = await caller.identify(store, Permission.READ)
    if who is not None and who.role not in _FEED_READERS:
        # An agent sees what it tried itself; every agent's refusals are an operator's view.
        if key_name is not None and key_name != who.name:
            raise _only_its_own(who, "refusals", hint="leave out --key to read this key's refusals")
        key_name = who.name
    rows, total = await store.list_refusals(
        key_name=key_name, interface=interface, before_id=before_id, limit=limit, offset=offset
    )
    data = [{k: r[k] for k in REFUSAL_FIELDS} for r in rows]
    meta = page_meta(data, total, limit=limit, offset=offset)
    if len(data) == limit and data[-1]["id"] > 1:  # maybe more: the next page starts below this one
        meta["next_before_id"] = data[-1]["id"] - 1
    return Reply(data, meta)


# -- each key's event feed ------------------------------------------------------

EVENTS_LIMIT_MAX = 1000
EVENT_FIELDS = (
    "id",
    "kind",
    "step",
    "run_id",
    "step_id",
    "status",
    "reason",
    "detail",
    "actor",
    "evidence_id",
    "key_id",
    "key_name",
    "created_at",
)


async def list_events(
    store: AppStore,
    caller: Caller,
    *,
    since: int = 0,
    limit: int = 100,
    offset: int = 0,
    key: str | None = None,
    all_keys: bool = False,
) -> Reply:
    """The caller's key's events after cursor ``since`` (every rejection, unknown and operator
    verdict on a step it enqueued), oldest first; ``meta.next_cursor`` is the ``since`` of the
    next call; ``offset`` of them skipped (meta.total counts every one after the cursor). ``key``
    (a key's name) or ``all_keys``: another key's feed, or every key's, for an operator or admin
    key (or the command line without a key, which reads every row anyway)."""
    holder = await caller.key_holder(store)
    if key is not None and all_keys:
        raise InvalidRequest([{"field": "--key", "message": "give --key NAME or --all-keys, not both"}])
    others = key is not None or all_keys
    if others and holder is not None and holder.role not in _FEED_READERS:
        raise _only_its_own(holder, "events", hint="leave out --key and --all-keys to read this key's feed")
    if not others and holder is None:
        # A feed is per key: no key is a missing credential, as for every command that needs one.
        raise AuthFailed(
            "no API key: a feed is per key",
            hint="give the key whose events to read (--api-key or EVQ_API_KEY), or --key NAME / --all-keys",
        )
    if holder is not None and key is None and not all_keys:
        rows, total = await store.key_events(
            since=since, limit=limit, offset=offset, key_id=holder.key_id, key_name=holder.name
        )
    else:
        rows, total = await store.key_events(since=since, limit=limit, offset=offset, key_name=key, every=all_keys)
    data = [with_labels({k: r.get(k) for k in EVENT_FIELDS}) for r in rows]
    cursor = data[-1]["id"] if data else since
    return Reply(data, {**page_meta(data, total, limit=limit, offset=offset), "since": since, "next_cursor": cursor})


# -- delivery events (worker/delivery.py) ---------------------------------------------

DELIVERIES_SHOWN = 100  # a step's delivery events `steps show` lists (newest first)
DELIVERY_FIELDS = (
    "id",
    "provider",
    "event_id",
    "type",
    "occurred_at",
    "received_at",
    "step",
    "run_id",
    "step_id",
    "key_digest",
    "message_id",
    "provider_message_id",
    "recipient",
    "detail",
)


def delivery_view(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A step's latest delivery state as every view shows it: {state, at, events}; None: no event."""
    if state is None:
        return None
    return {"state": state["state"], "at": state["at"], "events": int(state["events"])}


def public_deliveries(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r.get(k) for k in DELIVERY_FIELDS} for r in rows]


def delivery_actor(provider: str) -> str:
    """Who the evidence of a webhook's event names: the provider's webhook, not a person or key."""
    return f"webhook:{provider}"


async def receive_deliveries(
    store: AppStore, provider: str, events: Sequence[DeliveryEvent], step_providers: Collection[str]
) -> Reply:
    """Verified events from ``provider``'s webhook (its signature checked by the caller, the
    HTTP route): each stored, matched and acted on in a transaction of its own
    (DeliveryStore.delivery_record), so a provider that retries a whole batch after a
    failure part way finds the stored ones duplicates. ``step_providers``: the step providers
    whose messages this webhook can report on (Settings.webhook_step_providers); an event
    naming another's step is kept unmatched. Data: one entry per event, in order."""
    wrong = [i for i, e in enumerate(events) if e.provider != provider]
    if wrong:
        raise InvalidRequest(
            [{"field": f"events[{i}].provider", "message": f"not {provider!r}"} for i in wrong[:50]],
            hint="an event is stored under the provider whose webhook verified it",
        )
    actor = delivery_actor(provider)
    metrics.init_delivery(provider, DELIVERY_TYPES)  # every series at 0: the rates exist before the first event
    data: list[dict[str, Any]] = []
    for event in events:
        done = await store.delivery_record(event, actor=actor, step_providers=step_providers)
        log.info(
            "delivery_event",
            provider=provider,
            type=event.type,
            delivery=done.id,
            step=done.step,
            duplicate=done.duplicate,
            closed=done.closed,
        )
        data.append(
            {
                "event_id": event.event_id,
                "type": event.type,
                "matched": done.step is not None,
                "step": done.step,
                "duplicate": done.duplicate,
                "closed": done.closed,
            }
        )
    meta = {
        "count": len(data),
        "duplicates": sum(1 for d in data if d["duplicate"]),
        "unmatched": sum(1 for d in data if not d["matched"]),
        "closed": sum(1 for d in data if d["closed"]),
    }
    return Reply(data, meta)


async def _enqueued_by(store: AppStore, step_id: int, who: Identity) -> bool:
    try:
        detail = await store.get_step(step_id)
    except NotFound:
        return False
    return who.enqueued(detail.decision)


async def list_deliveries(
    store: AppStore,
    caller: Caller,
    *,
    unmatched: bool = False,
    step: int | None = None,
    provider: str | None = None,
    since: int | None = None,
    limit: int = 50,
    offset: int = 0,
) -> Reply:
    """Delivery events newest first: of one step, of one provider, or those that matched no step.
    ``since``: the next page, events older than this cursor (the last page's meta.next_cursor);
    ``offset`` of them skipped (meta.total counts every one that matches)."""
    if unmatched and step is not None:
        raise InvalidRequest([{"field": "--step", "message": "give --step ID or --unmatched, not both"}])
    who = await caller.identify(store, Permission.READ)
    if who is not None and who.role not in _FEED_READERS:
        # An agent reads the events of the sends it enqueued itself; every agent's (and the
        # unmatched ones, of nobody's) are an operator's view, as refusals are.
        mine = step is not None and not unmatched and await _enqueued_by(store, step, who)
        if not mine:
            raise _only_its_own(who, "steps' delivery events", hint="give --step ID of a step this key enqueued")
    rows, total = await store.delivery_events(
        step=step, unmatched=unmatched, provider=provider, before_id=since or None, limit=limit, offset=offset
    )
    data = public_deliveries(rows)
    meta = page_meta(data, total, limit=limit, offset=offset)
    if len(data) == limit and data[-1]["id"] > 1:  # maybe more: the next page is older than this one
        meta["next_cursor"] = data[-1]["id"]
    return Reply(data, meta)


# -- providers' circuits (worker/circuit.py) -----------------------------------------


def circuit_view(provider: str, row: Mapping[str, Any] | None) -> dict[str, Any]:
    """One provider's circuit as every interface shows it; no row means closed, never opened."""
    row = row or {}
    state = row.get("state") or "closed"
    held = state != "closed"
    reason = row.get("reason") if held else None
    return {
        "provider": provider,
        "state": state,
        "state_label": label(STATE_LABELS, state),
        "sending": not held,
        "reason": reason,
        "reason_label": label(REASON_LABELS, reason),
        "detail": row.get("detail") if held else None,
        "opened_at": row.get("opened_at"),
        # Durations in whole seconds: how long it has been open (down), how long until the next probe (up).
        "open_for_seconds": int(row["open_for"]) if held and row.get("open_for") is not None else None,
        "next_probe_at": row.get("probe_at"),
        "next_probe_in_seconds": math.ceil(max(0.0, row["probe_in"])) if row.get("probe_in") is not None else None,
        "failed_probes": row.get("probes", 0) if held else 0,
        "probe_owner": row.get("probe_owner"),
        "openings": row.get("openings", 0),
        "updated_at": row.get("updated_at"),
    }


def profile_view(profile: ProviderProfile | None) -> dict[str, Any] | None:
    """What a provider can do to settle a send whose answer was lost (docs/design.md,
    "Provider profiles"); None for a provider this evq has no adapter for."""
    if profile is None:
        return None
    window = profile.dedupe_window
    return {
        "dedupe_window_seconds": None if window is None else math.ceil(window),
        "lookup_by": list(profile.lookup_by),
        "webhook_events": list(profile.webhook_events),
        "resolvable": profile.resolvable,
    }


def rate_view(limit: RateLimit | None) -> dict[str, Any] | None:
    """The provider's shared rate limit (EVQ_RATE_LIMIT, worker/ratelimit.py); None: unlimited."""
    if limit is None:
        return None
    return {"per_second": limit.per_second, "burst": limit.burst, "setting": str(limit)}


async def list_providers(store: AppStore, caller: Caller, settings: Settings) -> Reply:
    """Every provider a step may name (and any other with a circuit row): its profile (what can
    settle a lost answer, from the settings: Settings.provider_profiles), its rate limit
    (EVQ_RATE_LIMIT), whether this process's EVQ_ADAPTER names it, and its circuit (whether
    evq sends to it now and, if not, why)."""
    await caller.identify(store, Permission.READ)
    rows = {r["provider"]: r for r in await store.circuits()}
    names = list(ADAPTERS) + sorted(set(rows) - set(ADAPTERS))
    profiles = settings.provider_profiles()
    limits = {limit.provider: limit for limit in settings.rate_limit}
    data = [
        {
            **circuit_view(name, rows.get(name)),
            "configured": name in settings.adapter,
            "profile": profile_view(profiles.get(name)),
            "rate_limit": rate_view(limits.get(name)),
        }
        for name in names
    ]
    meta = {
        # Every provider in one answer (a handful: the adapters and any a circuit row names), not paged.
        **page_meta(data, len(data), limit=None, offset=0),
        "held": sum(1 for d in data if not d["sending"]),
        "unresolvable": sum(1 for d in data if d["profile"] is not None and not d["profile"]["resolvable"]),
    }
    return Reply(data, meta)


# -- the approval policy (worker/approval.py) ----------------------------------

POLICY_USAGE_LIMIT = 20


async def show_policy(store: AppStore, caller: Caller, settings: Settings) -> Reply:
    """The approval policy (ApprovalPolicy.describe()) and the budget counters of the current
    windows, most used first (at most POLICY_USAGE_LIMIT: meta.usage_shown says how many)."""
    who = await caller.identify(store, Permission.READ)
    policy = settings.approval_policy()
    caps = {b.value: cap for b, cap in policy.budgets}
    usage = [
        {
            "budget": r["budget"],
            "scope": r["scope"],
            "window_start": r["window_start"],
            "used": r["used"],
            "cap": caps.get(r["budget"]),
        }
        for r in await store.budget_usage(limit=POLICY_USAGE_LIMIT)
    ]
    data = {**policy.describe(), "active": policy.active, "keys": await key_approvals(store, who), "usage": usage}
    return Reply(data, {"usage_shown": len(usage), "usage_limit": POLICY_USAGE_LIMIT})


async def key_approvals(store: AppStore, who: Identity | None) -> list[dict[str, Any]]:
    """Whose sends wait for a person: each active key that may enqueue, with its approval
    (always, policy: the rules above, never), oldest first. An agent key sees its own only
    (other keys' names are not its business); an operator, an admin and the command line see all."""
    may_enqueue = ALLOWED[Permission.ENQUEUE]
    keys = [k for k in await store.list_keys() if k["revoked_at"] is None and Role(k["role"]) in may_enqueue]
    if who is not None and who.role is Role.AGENT:
        keys = [k for k in keys if k["key_id"] == who.key_id]
    return [{"name": k["name"], "role": k["role"], "approval": k["approval"]} for k in keys]


# -- operators ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """Which unknown rows a resolve acts on: one by id, or every row a filter matches."""

    step_id: int | None = None
    statuses: tuple[str, ...] = ()
    filters: Mapping[str, Any] = field(default_factory=dict)
    ids: tuple[int, ...] = ()  # bulk: only these (the rows a preview showed)
    limit: int | None = None
    max_failures: int | None = None

    def check(self) -> None:
        bulk = {**self.filters, "limit": self.limit, "max_failures": self.max_failures}
        given = ["--status"] * bool(self.statuses) + [
            "--" + k.replace("_", "-") for k, v in bulk.items() if v is not None
        ]
        if self.step_id is not None and given:
            raise InvalidRequest([{"field": given[0], "message": "give a STEP_ID or bulk filters, not both"}])
        # Fail closed: a list may read a blank filter as none, but a bulk action that dropped
        # it would act on every row the other filters match (`--search ""` closing them all).
        for key, value in self.filters.items():
            if isinstance(value, str) and not value.strip():
                flag = "--" + key.replace("_", "-")
                raise InvalidRequest([{"field": flag, "message": "empty: give a value or leave it out"}])
        if self.step_id is None and not self.statuses:
            raise InvalidRequest(
                [{"field": "STEP_ID", "message": "give a STEP_ID, or --status unknown (with filters) for many rows"}]
            )
        if self.statuses == (str(Status.REJECTED),):
            return  # a requeue of rejected rows: resolve() allows it for a retry's preview or its ids only
        if any(s != str(Status.UNKNOWN) for s in self.statuses):
            raise InvalidRequest([{"field": "--status", "message": "only unknown rows can be resolved"}])

    def requeue(self, resolution: Resolution, *, dry_run: bool) -> bool:
        """Whether this is a bulk requeue of rejected rows (the dead-letter retry), refused
        unless it is a retry and either a preview or exactly the ids a preview showed: a
        filter over rejected rows, applied as of now, could requeue rows nobody looked at."""
        if self.statuses != (str(Status.REJECTED),):
            return False
        if resolution.verdict is not Verdict.RETRY:
            raise InvalidRequest([{"field": "--status", "message": "rejected rows can only be retried (--as retry)"}])
        if not dry_run and not self.ids:
            raise InvalidRequest(
                [{"field": "--status", "message": "a bulk retry of rejected rows acts on the ids a preview showed"}]
            )
        return True

    def where(self, now: datetime) -> StepFilter:
        if self.step_id is not None:
            return StepFilter(ids=(self.step_id,), limit=1)
        if self.ids:
            # Exactly the rows a preview showed, whatever state they are in now: one that
            # someone else closed since is tried and reported as a conflict, not skipped.
            return StepFilter(ids=self.ids, limit=None)
        return step_filter(now, self.statuses, self.filters, limit=self.limit)


async def resolve(
    store: AppStore,
    caller: Caller,
    resolution: Resolution,
    selection: Selection,
    *,
    default_max_attempts: int,
    dry_run: bool = False,
    signals: bool = False,
    now: datetime | None = None,
    unresolvable: Collection[str] | None = None,
) -> Reply:
    """Close unknown rows with an audited verdict. One row: its failure is the error.
    Bulk: each row on its own; some may fail (someone closed them first) while the rest
    succeed (status partial_failure). A dry run is a read: the rows that would change."""
    selection.check()
    requeue = selection.requeue(resolution, dry_run=dry_run)
    now = now or datetime.now(UTC)
    where = selection.where(now)
    identity = await caller.identify(store, Permission.READ if dry_run else Permission.RESOLVE)
    rows, _ = await store.list_steps(where, now=now)
    if selection.step_id is not None:
        _only_unknown(selection.step_id, rows, resolution)
    if requeue and not selection.ids:
        # A preview of a requeue: only the rows the one-row retry would take (no attempt delivered).
        rows = [r for r in rows if requeueable(r.status, r.reason)]
    head = {"verdict": str(resolution.verdict), "to_status": str(resolution.verdict.to_status)}
    if dry_run:
        # Unknown rows: no delivery event can be on one (any event settles it), so the plan has no delivery.
        plan = [{**_no_delivery(summary(r, unresolvable=unresolvable)), "to_status": head["to_status"]} for r in rows]
        return Reply({"dry_run": True, **head, "steps": plan}, {"count": len(plan)})
    assert identity is not None  # RESOLVE is never granted without a key

    async def close(row: StepSummary) -> dict[str, Any]:
        # Each row checked as the one-row path checks it, in the state it is in now: a
        # previewed row someone else changed since is a conflict, not a close.
        _only_unknown(row.id, [row], resolution)
        if selection.ids and str(row.status) not in selection.statuses:
            # Exactly a preview's ids, and only while each is in a state the action applies to:
            # a retry's ids must still be rejected, a close's still unknown.
            raise StateConflict(
                f"step {row.id} is {row.status}, not {' or '.join(selection.statuses)}",
                context={"id": row.id, "status": str(row.status)},
            )
        done = await store.resolve(row.id, resolution, actor=identity.name, default_max_attempts=default_max_attempts)
        return done.to_dict()

    if selection.step_id is not None:
        tally: Tally[StepSummary] = Tally(
            total=1, succeeded=1, results=[{"outcome": "succeeded", **await close(rows[0])}]
        )
    else:
        tally = await each(
            rows,
            close,
            key=lambda r: {"id": r.id},
            what="steps resolve",
            max_failures=selection.max_failures,
            handle_signals=signals,
        )
    status = "partial_failure" if tally.failed else "success"
    return Reply({"dry_run": False, **head, **tally.summary}, status=status)


def _no_delivery(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("delivery", None)
    return row


def _only_unknown(step_id: int, rows: list[StepSummary], resolution: Resolution) -> None:
    if not rows:
        raise NotFound(f"no step with id {step_id}", hint="`evq steps list --status unknown` shows the ids")
    if resolution.verdict is Verdict.RETRY and requeueable(rows[0].status, rows[0].reason):
        # The dead-letter requeue; the statement itself checks that no attempt may have been delivered.
        return
    if rows[0].status != Status.UNKNOWN:
        raise StateConflict(
            f"step {step_id} is {rows[0].status}, not unknown: only unknown rows can be resolved",
            hint=f"`evq steps show {step_id}` shows who changed it and when",
            context={"id": step_id, "status": str(rows[0].status), "reason": rows[0].reason},
        )


def json_field_names(exc: InvalidRequest) -> InvalidRequest:
    """The same error with fields named as JSON names them (``--older-than`` -> ``older_than``),
    for the interfaces that take JSON rather than flags."""
    fields = [{**f, "field": _json_name(f["field"])} for f in exc.errors]
    # E_UNRESOLVABLE and E_BUDGET keep their codes; every other field error is E_INVALID_ARG.
    kind = type(exc) if isinstance(exc, (Unresolvable, BudgetExceeded)) else InvalidRequest
    return kind(fields, hint=exc.hint)


def _json_name(name: str) -> str:
    if name.startswith("--"):
        return name[2:].replace("-", "_")
    # STEP_ID's property in every JSON input (ops/app/commands.py).
    return "step_id" if name == "STEP_ID" else name
