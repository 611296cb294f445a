"""The Python enqueue API: inside the caller's transaction, or in its own.

    from evq.adapters.postgres.enqueue import enqueue
    with psycopg.connect(url) as conn:          # or a SQLAlchemy Connection
        with conn.transaction():
            ...  # the caller's own writes
            step = enqueue(conn, {"run_id": ..., "step_id": ..., ...})

The key's ledger row (step_keys), decision and step are written by one statement, so they
commit or roll back with the caller's transaction; on an autocommit connection that one statement is a
transaction of its own (one round trip, as the store's pool does it). The operation is written once as a generator of
(statement, params) that receives rows; :func:`run_sync` and :func:`run_async`
drive it, so sync and async callers share every line of logic.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from evq.adapters.postgres.database import translated
from evq.adapters.postgres.queries import Q
from evq.worker import metrics
from evq.worker.approval_policy import (
    PRIORITIES,
    ApprovalPolicy,
    KeyApproval,
    OverBudget,
    applied,
    batch_counters,
    budget_charges,
    budget_hold,
    budget_refusal,
    contact_holds,
    contact_keys,
    contacts,
    gated,
    going_out,
    key_approval,
    memory_keys,
    sender_of,
    static_holds,
)
from evq.worker.enqueue import (
    answer_held,
    existing_or_conflict,
    flag_ambiguity,
    merge_answers,
    must_look_up,
    new_message_id,
    result_from_row,
    validate,
    validate_many,
)
from evq.worker.errors import BudgetExceeded, Conflict, InvalidRequest
from evq.worker.keys import Permission, check_key, split_key
from evq.worker.logs import get_logger
from evq.worker.records import EnqueueResult
from evq.worker.refusals import describe
from evq.worker.request import Actor, Policy, ValidRequest
from evq.worker.states import Status

log = get_logger("evq.enqueue")
Rows = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Each:
    """One statement run once per parameter set, in one round trip (psycopg's pipeline,
    ``executemany(returning=True)``): an op that yields one gets each run's rows, in order.
    For statements that do not depend on each other's rows."""

    statement: str
    params: Sequence[Mapping[str, Any]]


Op = Generator[tuple[str, Mapping[str, Any]] | Each, Any, Any]


def enqueue_params(
    request: ValidRequest,
    now: datetime | None = None,
    *,
    hold: Mapping[str, Any] | None = None,
    expires_seconds: float | None = None,
) -> dict[str, Any]:
    d = request.decision
    actor = request.actor
    return {
        "held": hold is not None,
        "hold": None if hold is None else json.dumps(hold, ensure_ascii=False),
        "hold_expires_seconds": expires_seconds,
        "priority": PRIORITIES[request.priority],
        "send_at": request.send_at,
        "now": now,
        "run_id": request.run_id,
        "step_id": request.step_id,
        "idempotency_key": request.idempotency_key,
        "message_id": new_message_id(request),
        "provider": request.provider,
        "payload": request.payload_json,
        "payload_sha256": request.payload_sha256,
        "max_attempts": request.max_attempts,
        "notify": request.notify,
        "intent": d.intent,
        "instruction_version": d.instruction_version,
        "prompt_version": d.prompt_version,
        "model": d.model,
        "tool": d.tool,
        "rationale": None if d.rationale is None else json.dumps(d.rationale, ensure_ascii=False),
        "decided_at": d.decided_at,
        "actor": actor.name if actor else None,
        "actor_key_id": actor.key_id if actor else None,
        "interface": actor.interface if actor else None,
    }


def key_params(request: ValidRequest) -> dict[str, Any]:
    """step_get_by_key's parameters: the row holding the request's key, or its run and step ids."""
    return {"idempotency_key": request.idempotency_key, "run_id": request.run_id, "step_id": request.step_id}


def enqueue_op(request: ValidRequest, now: datetime | None = None) -> Op:
    rows = yield Q["step_enqueue"], enqueue_params(request, now)
    if not rows:
        # A concurrent enqueue of the same key committed after this statement's
        # snapshot: ON CONFLICT skipped our insert, and only a new snapshot sees theirs.
        rows = yield Q["step_get_by_key"], key_params(request)
        if not rows:
            raise Conflict("a concurrent enqueue holds this key; retry", context={"key": request.idempotency_key})
    row = rows[0]
    if row["created"]:
        metrics.ENQUEUED.inc()
        metrics.observe_decision_to_enqueue(request.decision.decided_at, row["created_at"])
        return result_from_row(row)
    return existing_or_conflict(row, request)


# Rows per batch statement: large enough that the per-statement cost vanishes,
# small enough that one statement's arrays stay a few megabytes.
MANY_CHUNK = 5000


def enqueue_many_params(
    requests: Sequence[ValidRequest], now: datetime | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The batch statement's parameters, and the Message-ID given to each request."""
    message_ids = [new_message_id(request) for request in requests]
    rows = []
    for request, message_id in zip(requests, message_ids, strict=True):
        d = request.decision
        actor = request.actor
        head = _dumps(
            [
                request.run_id,
                request.step_id,
                request.idempotency_key,
                message_id,
                request.provider,
                request.payload_sha256,
                request.max_attempts,
                request.notify,
                d.intent,
                d.instruction_version,
                d.prompt_version,
                d.model,
                d.tool,
                d.rationale,
                None if d.decided_at is None else d.decided_at.isoformat(),
                actor.name if actor else None,
                actor.key_id if actor else None,
                actor.interface if actor else None,
                PRIORITIES[request.priority],
                None if request.send_at is None else request.send_at.isoformat(),
            ]
        )
        # The payload goes in as the canonical JSON text validation made (and hashed),
        # not serialised a second time: a JSON value, not a string of JSON.
        rows.append(f"{head[:-1]},{request.payload_json}]")
    return {"now": now, "requests": f"[{','.join(rows)}]"}, message_ids


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def gated_op(request: ValidRequest, approval: ApprovalPolicy, now: datetime | None = None) -> Op:
    """Enqueue one request under the approval policy (docs/design.md, "Approvals and budgets"),
    in the caller's transaction (it must be one: the budget counters' row locks are held until
    the step is written and committed with them).

    Only a new step is judged: a repeat of a stored key is answered as its row is (held or
    not), charging nothing. Then the rules that need no database, first contact
    (known_recipients) and, for a send nothing else holds, the budgets: each counter charged
    in sorted order under its row lock, never past its cap. The first that would pass its cap
    gives back what this send charged before it, and the send is held (EVQ_BUDGET_ACTION=hold)
    or refused (E_BUDGET, nothing written). A held send charges nothing: if a person approves
    it, that is their decision, not the agent's budget. A send not held charges its budgets
    and makes its recipients (and their domains) known to its sender.

    The policy is the installation's as the request's API key bends it (worker/approval_policy.py,
    ``applied``: ``always`` holds every send, ``never`` drops the rules that ask a person)."""
    rows = yield Q["step_get_by_key"], key_params(request)
    if rows:
        return existing_or_conflict(rows[0], request)
    approval = applied(approval, request)
    sender = sender_of(request.payload)
    at, holds = yield from _rule_holds(request, approval, sender, now)
    charged: list[dict[str, Any]] = []
    if not holds:
        name = request.actor.name if request.actor else None
        for charge in budget_charges(
            approval,
            run_id=request.run_id,
            actor=name,
            recipients=request.recipients,
            now=going_out(at, request.send_at),
        ):
            budget, scope, window_start, amount, cap = charge
            params = {
                "now": at,
                "budget": budget,
                "scope": scope,
                "window_start": window_start,
                "amount": amount,
                "cap": cap,
            }
            if (yield Q["budget_charge"], params):
                charged.append(params)
                continue
            [used] = yield Q["budget_used"], params
            over = budget_hold(charge, used["used"])
            yield from _uncharge(charged)
            if approval.over_budget is OverBudget.REFUSE:
                raise budget_refusal(over)
            holds.append(over)
            break
    hold = {"rules": holds} if holds else None
    expires = approval.expires_after.total_seconds() if approval.expires_after is not None else None
    rows = yield Q["step_enqueue"], enqueue_params(request, at, hold=hold, expires_seconds=expires)
    if not rows or not rows[0]["created"]:
        # A concurrent enqueue of the same key committed first: this send is theirs, charged once.
        yield from _uncharge(charged)
        if not rows:
            rows = yield Q["step_get_by_key"], key_params(request)
            if not rows:
                raise Conflict("a concurrent enqueue holds this key; retry", context={"key": request.idempotency_key})
        return existing_or_conflict(rows[0], request)
    row = rows[0]
    if hold is not None:
        actor = request.actor
        who = (actor.name or actor.interface) if actor else "python"
        yield Q["step_held_evidence"], {"now": at, "id": row["id"], "run_id": row["run_id"], "actor": who,
                                        "detail": json.dumps(hold, ensure_ascii=False)}  # fmt: skip
    else:
        learnt = memory_keys(request.recipients)
        yield Q["known_recipients_add"], {"now": at, "sender": sender, "keys": learnt, "step": row["id"]}
    metrics.ENQUEUED.inc()
    metrics.observe_decision_to_enqueue(request.decision.decided_at, row["created_at"])
    return result_from_row(row)


def preview_op(request: ValidRequest, approval: ApprovalPolicy, now: datetime | None = None) -> Op:
    """What :func:`gated_op` would hold a new step for, read without writing or locking (a
    dry run): the same rules, the budgets as they stand. A concurrent enqueue may change
    the answer; the real enqueue decides."""
    approval = applied(approval, request)
    at, holds = yield from _rule_holds(request, approval, sender_of(request.payload), now)
    if not holds:
        name = request.actor.name if request.actor else None
        for charge in budget_charges(
            approval,
            run_id=request.run_id,
            actor=name,
            recipients=request.recipients,
            now=going_out(at, request.send_at),
        ):
            budget, scope, window_start, amount, cap = charge
            [used] = yield Q["budget_used"], {"budget": budget, "scope": scope, "window_start": window_start}
            if used["used"] + amount > cap:
                holds.append(budget_hold(charge, used["used"]))
                break
    return holds


def _rule_holds(
    request: ValidRequest, approval: ApprovalPolicy, sender: str, now: datetime | None
) -> Generator[tuple[str, Mapping[str, Any]], Rows, tuple[datetime, list[dict[str, Any]]]]:
    """The transaction's clock and the holds of every rule but the budgets: the static ones and
    first contact (the sender's known recipients, read in the same statement as the clock)."""
    keys = contact_keys(approval, contacts(request.recipients, request.notify))
    [context] = yield Q["approval_context"], {"now": now, "sender": sender, "keys": keys}
    at: datetime = context["now"]
    # The hours that matter are those the send would go out in: a scheduled one's.
    when = going_out(at, request.send_at)
    holds = static_holds(
        approval, recipients=len(request.recipients), now=when, requested=request.require_approval
    ) + contact_holds(approval, keys, context["known"])
    return at, holds


def _uncharge(charged: Sequence[Mapping[str, Any]]) -> Op:
    for params in reversed(charged):
        yield Q["budget_uncharge"], params


def gated_many_op(requests: Sequence[ValidRequest], approval: ApprovalPolicy, now: datetime | None = None) -> Op:
    """The batch under an active policy: one request at a time (each judged and charged in
    turn), in the caller's one transaction. A refusal names the request (``[index].budget...``).

    Every counter the batch may charge is locked first, in one sorted order (budget_lock):
    request by request, the counters would be taken in an order no other batch shares.

    A batch whose every request comes from a key whose approval is ``always`` (each one held,
    nothing charged) takes :func:`held_many_op` instead: the same rows in three round trips, not
    four a request."""
    if requests and all(key_approval(r.actor) is KeyApproval.ALWAYS for r in requests):
        return (yield from held_many_op(requests, approval, now))
    if approval.budgets:
        [context] = yield Q["approval_context"], {"now": now, "sender": "", "keys": []}
        at = context["now"]  # the transaction's clock: every request's windows are these
        for budget, scope, window in batch_counters(approval, requests, now=at):
            yield Q["budget_lock"], {"now": at, "budget": budget, "scope": scope, "window_start": window}
    results: list[EnqueueResult] = []
    for i, request in enumerate(requests):
        try:
            results.append((yield from gated_op(request, approval, now)))
        except BudgetExceeded as exc:
            raise BudgetExceeded([{**e, "field": f"[{i}].{e['field']}"} for e in exc.errors], hint=exc.hint) from None
    return results


def held_many_op(requests: Sequence[ValidRequest], approval: ApprovalPolicy, now: datetime | None = None) -> Op:
    """The batch of a key whose approval is ``always``: :func:`gated_op`'s rows and answers for
    each request, but every statement of a kind sent for the whole batch at once. Every new step
    is held whatever the other rules say (the key's rule holds it), so nothing is charged, and
    nothing depends on another request's outcome: each request's clock and known recipients
    (approval_context, so its hold names every rule that holds it, first contact included), then
    every step, then every new step's ``held`` evidence. In the caller's one transaction, the
    statements run in the order they are sent, so a key repeated in the batch meets its first
    step as in :func:`gated_op` (answered as that row is, or refused when it differs)."""
    policies = [applied(approval, r) for r in requests]
    senders = [sender_of(r.payload) for r in requests]
    keys = [contact_keys(p, contacts(r.recipients, r.notify)) for p, r in zip(policies, requests, strict=True)]
    contexts: list[Rows] = yield Each(
        Q["approval_context"],
        [{"now": now, "sender": sender, "keys": k} for sender, k in zip(senders, keys, strict=True)],
    )
    enqueues, holds = [], []
    for request, policy, k, [context] in zip(requests, policies, keys, contexts, strict=True):
        at: datetime = context["now"]
        rules = static_holds(
            policy,
            recipients=len(request.recipients),
            now=going_out(at, request.send_at),
            requested=request.require_approval,
        ) + contact_holds(policy, k, context["known"])
        if not rules:  # the key's rule always holds: never, unless worker/approval_policy.py changed that
            raise RuntimeError("a request of a key whose approval is always was not held")
        hold = {"rules": rules}
        holds.append((at, hold))
        expires = policy.expires_after.total_seconds() if policy.expires_after is not None else None
        enqueues.append(enqueue_params(request, at, hold=hold, expires_seconds=expires))
    written: list[Rows] = yield Each(Q["step_enqueue"], enqueues)
    results: list[EnqueueResult] = []
    evidence = []
    for request, rows, (at, hold) in zip(requests, written, holds, strict=True):
        if rows and rows[0]["created"]:
            row = rows[0]
            actor = request.actor
            who = (actor.name or actor.interface) if actor else "python"
            evidence.append({"now": at, "id": row["id"], "run_id": row["run_id"], "actor": who,
                             "detail": json.dumps(hold, ensure_ascii=False)})  # fmt: skip
            metrics.ENQUEUED.inc()
            metrics.observe_decision_to_enqueue(request.decision.decided_at, row["created_at"])
            results.append(result_from_row(row))
            continue
        if not rows:
            # A concurrent enqueue of the same key committed after the statement's snapshot.
            rows = yield Q["step_get_by_key"], key_params(request)
            if not rows:
                raise Conflict("a concurrent enqueue holds this key; retry", context={"key": request.idempotency_key})
        results.append(existing_or_conflict(rows[0], request))
    if evidence:
        yield Each(Q["step_held_evidence"], evidence)
    return results


def enqueue_many_op(
    requests: Sequence[ValidRequest], now: datetime | None = None, approval: ApprovalPolicy = ApprovalPolicy()
) -> Op:
    """Enqueue validated requests with one multi-row statement per chunk, keeping
    every rule of the single enqueue; the caller's transaction makes it all or none.
    Under an active approval policy, one request at a time (:func:`gated_many_op`)."""
    if gated(approval, requests):
        return (yield from gated_many_op(requests, approval, now))
    results: list[EnqueueResult] = []
    for start in range(0, len(requests), MANY_CHUNK):
        chunk = requests[start : start + MANY_CHUNK]
        params, message_ids = enqueue_many_params(chunk, now)
        by_ord: list[Mapping[str, Any] | None] = [None] * len(chunk)
        for row in (yield Q["step_enqueue_many"], params):
            by_ord[row["ord"] - 1] = row
        created = 0
        for request, message_id, row in zip(chunk, message_ids, by_ord, strict=True):
            if row is None:
                raise RuntimeError("step_enqueue_many returned no row for a request")
            if row["id"] is not None:
                created += 1
                # Written by this statement: everything but the id is what we sent,
                # and a new step starts pending (the column's default).
                results.append(
                    EnqueueResult(
                        id=row["id"],
                        run_id=request.run_id,
                        step_id=request.step_id,
                        idempotency_key=request.idempotency_key,
                        message_id=message_id,
                        status=Status.PENDING,
                        created=True,
                        provider=request.provider,
                    )
                )
            elif row["existing_id"] is not None:
                results.append(existing_or_conflict({**row, "id": row["existing_id"], "created": False}, request))
            else:
                # Rare: the key was not settled by the batch statement (see queries.sql).
                results.append((yield from enqueue_op(request, now)))
        metrics.ENQUEUED.inc(created)
    return results


def checked_op(requests: Sequence[ValidRequest], policy: Policy, now: datetime | None = None, *, many: bool) -> Op:
    """The Python API's enqueue under ``policy``: with EVQ_REFUSE_UNRESOLVABLE, each request it
    concerns is looked up first and never inserted (worker/enqueue.py, must_look_up and
    answer_held: a held one is answered as its row is, a new one refused before anything is
    written); the rest enqueued (one request: step_enqueue; ``many``: the batch statement).
    Every result flagged with its step's ambiguity."""
    held: dict[int, Mapping[str, Any] | None] = {}
    for i in must_look_up(requests, policy):
        rows = yield Q["step_get_by_key"], key_params(requests[i])
        held[i] = rows[0] if rows else None
    answered = answer_held(requests, held, policy, indexed=many)
    rest = [r for i, r in enumerate(requests) if i not in answered]
    if not rest:
        made: list[EnqueueResult] = []
    elif many:
        made = yield from enqueue_many_op(rest, now, policy.approval)
    elif gated(policy.approval, rest):
        made = [(yield from gated_op(rest[0], policy.approval, now))]
    else:
        made = [(yield from enqueue_op(rest[0], now))]
    results = merge_answers(answered, made)
    return [flag_ambiguity(r, v, policy) for r, v in zip(results, requests, strict=True)]


def _run_checked(conn: psycopg.Connection, requests: Sequence[ValidRequest], policy: Policy, op: Op) -> Any:
    """:func:`run_sync`; a gated enqueue on an autocommit connection in a transaction of its
    own (its statements commit together). In the caller's transaction it is the caller's."""
    if conn.autocommit and gated(policy.approval, requests):
        with conn.transaction():
            return run_sync(conn, op)
    return run_sync(conn, op)


async def _run_checked_async(
    conn: psycopg.AsyncConnection, requests: Sequence[ValidRequest], policy: Policy, op: Op
) -> Any:
    if conn.autocommit and gated(policy.approval, requests):
        async with conn.transaction():
            return await run_async(conn, op)
    return await run_async(conn, op)


def run_sync(conn: psycopg.Connection, op: Op) -> Any:
    with translated(), conn.cursor(row_factory=dict_row) as cur:
        try:
            step = next(op)
            while True:
                if isinstance(step, Each):
                    step = op.send(_each_sync(cur, step))
                    continue
                statement, params = step
                cur.execute(statement, params)
                step = op.send(cur.fetchall() if cur.description else [])
        except StopIteration as done:
            return done.value


def _each_sync(cur: psycopg.Cursor[Any], each: Each) -> list[Rows]:
    if not each.params:
        return []
    cur.executemany(each.statement, each.params, returning=True)
    out = []
    while True:
        out.append(cur.fetchall() if cur.description else [])
        if not cur.nextset():
            return out


async def run_async(conn: psycopg.AsyncConnection, op: Op) -> Any:
    with translated():
        async with conn.cursor(row_factory=dict_row) as cur:
            try:
                step = next(op)
                while True:
                    if isinstance(step, Each):
                        step = op.send(await _each_async(cur, step))
                        continue
                    statement, params = step
                    await cur.execute(statement, params)
                    step = op.send(await cur.fetchall() if cur.description else [])
            except StopIteration as done:
                return done.value


async def _each_async(cur: psycopg.AsyncCursor[Any], each: Each) -> list[Rows]:
    if not each.params:
        return []
    await cur.executemany(each.statement, each.params, returning=True)
    out = []
    while True:
        out.append(await cur.fetchall() if cur.description else [])
        if not cur.nextset():
            return out


def _driver_connection(conn: Any) -> Any:
    """The psycopg connection behind a psycopg or SQLAlchemy connection."""
    if isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        return conn
    raw = getattr(conn, "connection", None)  # sqlalchemy.Connection -> pool proxy
    driver = getattr(raw, "driver_connection", None)
    if isinstance(driver, psycopg.Connection):
        return driver
    raise TypeError(
        f"enqueue needs a psycopg connection or a SQLAlchemy connection using psycopg, got {type(conn).__name__}"
    )


def enqueue(
    conn: Any,
    request: Mapping[str, Any] | ValidRequest,
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> EnqueueResult:
    """Enqueue one send inside ``conn``'s current transaction (psycopg or SQLAlchemy, sync).

    Raises InvalidRequest before anything is written, IdempotencyConflict when the
    key is taken by a different request (another payload or another provider). Commit is
    the caller's. A repeat of a key whose step evq prune removed is answered from the key
    ledger as the step ended (``pruned`` true, ``created`` false): nothing is written or sent.

    A ``policy`` from the settings (``Settings.load().policy()``) names the providers that
    could never settle a lost answer (docs/design.md, "Provider profiles"): the result's
    ``ambiguity`` is then ``"unresolvable"`` for a step through one, and with
    EVQ_REFUSE_UNRESOLVABLE such a request is refused (Unresolvable, E_UNRESOLVABLE) before
    anything is written, unless a step already holds its key: that one is answered as it is
    (``created`` false). The default ``Policy()`` knows no profiles and flags nothing.

    ``api_key`` (``evq_...``, a key that may enqueue): the send is the key's, as if it came
    through the CLI with that key: checked on ``conn`` (AuthFailed when it is not valid or its
    role may not enqueue), recorded as its actor, and judged by its approval (always, policy or
    never; docs/design.md, "Approvals and budgets"). Without one, the send is nobody's key's and
    the installation's rules (``policy.approval``) decide, as they always did.
    """
    conn = _driver_connection(conn)
    valid = _stamped(validate(request, policy), actor, api_key, lambda op: run_sync(conn, op))
    [result] = _run_checked(conn, [valid], policy, checked_op([valid], policy, now, many=False))
    return result


async def enqueue_async(
    conn: Any,
    request: Mapping[str, Any] | ValidRequest,
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> EnqueueResult:
    """The same for a psycopg AsyncConnection or a SQLAlchemy AsyncConnection."""
    valid = validate(request, policy)
    if not isinstance(conn, psycopg.AsyncConnection):
        raw = await conn.get_raw_connection()  # sqlalchemy.ext.asyncio.AsyncConnection
        conn = raw.driver_connection
    key = None if api_key is None else await run_async(conn, key_actor_op(api_key))
    valid = _stamped(valid, actor, api_key, lambda op: key)
    [result] = await _run_checked_async(conn, [valid], policy, checked_op([valid], policy, now, many=False))
    return result


def enqueue_many(
    conn: Any,
    requests: Sequence[Mapping[str, Any] | ValidRequest],
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> list[EnqueueResult]:
    """Enqueue several sends inside ``conn``'s current transaction, in one round trip.

    Every request is validated first: one bad request raises InvalidRequest naming it
    (``[index].field``) and nothing is written. Commit is the caller's. ``api_key``: as
    :func:`enqueue`'s.
    """
    conn = _driver_connection(conn)
    checked = validate_many(list(requests), policy)
    key = None if api_key is None else run_sync(conn, key_actor_op(api_key))
    valid = [_stamped(v, actor, api_key, lambda op: key) for v in checked]
    return list(_run_checked(conn, valid, policy, checked_op(valid, policy, now, many=True)))


async def enqueue_many_async(
    conn: Any,
    requests: Sequence[Mapping[str, Any] | ValidRequest],
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> list[EnqueueResult]:
    """The same for a psycopg AsyncConnection or a SQLAlchemy AsyncConnection."""
    checked = validate_many(list(requests), policy)
    if not isinstance(conn, psycopg.AsyncConnection):
        raw = await conn.get_raw_connection()
        conn = raw.driver_connection
    key = None if api_key is None else await run_async(conn, key_actor_op(api_key))
    valid = [_stamped(v, actor, api_key, lambda op: key) for v in checked]
    return list(await _run_checked_async(conn, valid, policy, checked_op(valid, policy, now, many=True)))


def enqueue_own(
    url: str,
    request: Mapping[str, Any] | ValidRequest,
    *,
    policy: Policy = Policy(),
    record_refusals: bool = True,
    actor: str | None = None,
    api_key: str | None = None,
) -> EnqueueResult:
    """Enqueue in a transaction of its own (opens and closes one connection).

    Autocommit: decision and step are one statement, so that statement is the whole
    transaction, without a BEGIN and a COMMIT round trip around it.

    A refused request is recorded in ``enqueue_refusals`` (interface ``python``, no key
    name: this API takes none) before InvalidRequest is raised, unless ``record_refusals``
    is false; a failure to record it never replaces the refusal. :func:`enqueue` and the
    other calls inside the caller's transaction record nothing: a row written there would
    go with the caller's rollback, and one written on another connection would need a
    connection this API was not given. Their refusals are counted by this process's
    ``evq_validation_errors_total`` only. ``api_key``: as :func:`enqueue`'s.
    """
    from evq.adapters.postgres.database import connect_kwargs

    try:
        checked = validate(request, policy)
        with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
            valid = _stamped(checked, actor, api_key, lambda op: run_sync(conn, op))
            [result] = _run_checked(conn, [valid], policy, checked_op([valid], policy, many=False))
            return result
    except InvalidRequest as exc:  # its fields, or E_UNRESOLVABLE for a step it would create
        if record_refusals:
            _record_refusal(url, request, exc)
        raise


def _record_refusal(url: str, request: Any, exc: InvalidRequest) -> None:
    """The refusal in a statement (a transaction) of its own; best effort."""
    from evq.adapters.postgres.database import connect_kwargs
    from evq.adapters.postgres.store.refusals import refusal_params

    params = refusal_params(describe("python", [request], exc.errors, key_name=None))
    try:
        with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
            conn.execute(Q["refusal_record"], params)
    except Exception as failure:
        log.warning("refusal_not_recorded", interface="python", error_class=type(failure).__name__)


# Where the Python API's caller gives a key (the words of an AuthFailed's hint).
PYTHON_KEY_SOURCE = "the api_key= argument"


def key_actor_op(presented: str) -> Op:
    """The Python API's ``api_key=``: the key's row read on the caller's connection and checked
    as every interface checks a key (worker/keys.py, check_key; it must may enqueue), and the
    actor it makes: its name, public id and approval, interface ``python``."""
    parts = split_key(presented)
    rows = yield Q["api_key_by_id"], {"key_id": parts[0] if parts else ""}
    row = rows[0] if rows and rows[0]["name"] is not None else None
    who = check_key(presented, row, Permission.ENQUEUE, source=PYTHON_KEY_SOURCE)
    return Actor(interface="python", key_id=who.key_id, name=who.name, approval=str(who.approval))


def _stamped(request: ValidRequest, actor: str | None, api_key: str | None, run: Any) -> ValidRequest:
    """The request with the Python API's actor: the key's (``run`` drives key_actor_op on the
    caller's connection) or, without a key, whatever ``actor=`` named."""
    if api_key is None:
        return _as_python(request, actor)
    if actor is not None:
        raise TypeError("give actor= or api_key=, not both: a key's name is its actor")
    if request.actor is not None:
        return request
    return replace(request, actor=run(key_actor_op(api_key)))


def _as_python(request: ValidRequest, actor: str | None) -> ValidRequest:
    """The request as the Python API enqueues it: no key, so the actor is whatever the
    caller named (``actor=``, maybe None) and the interface is ``python``. A request
    an interface already stamped (a ValidRequest passed through) keeps its actor."""
    if request.actor is not None:
        return request
    return replace(request, actor=Actor(interface="python", name=actor))
