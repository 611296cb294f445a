"""steps enqueue through the application layer: validation, the store's enqueue, the answer an
agent reads (what is held and why), refusals recorded, and the dry run's plan."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from evq.ops.app.labels import with_labels
from evq.ops.app.service.common import Caller, Reply, verdict_view
from evq.worker.approval_policy import gated
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
    BudgetExceeded,
    IdempotencyConflict,
    InvalidRequest,
)
from evq.worker.keys import ALLOWED, Identity, Permission
from evq.worker.logs import get_logger
from evq.worker.ports import AppStore
from evq.worker.records import AMBIGUITY_HINTS, EnqueueResult
from evq.worker.refusals import describe
from evq.worker.request import Actor, Policy, ValidRequest
from evq.worker.states import Status

log = get_logger("evq.service")
_T = TypeVar("_T")


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
    (worker/approval_policy.py decides what it holds, the same for every interface)."""
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
