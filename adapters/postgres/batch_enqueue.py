"""The enqueue of a batch, as ops (op_runner.py): :func:`enqueue_many_op` writes a chunk of
requests with one multi-row statement when no approval policy is in force; under one,
:func:`gated_many_op` takes the requests one at a time through single_enqueue.gated_op, or
:func:`held_many_op` for a key whose approval is ``always`` (every statement sent for the
whole batch at once). Every rule of the single enqueue holds for each request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from evq.adapters.postgres.op_runner import Each, Op, Rows
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.single_enqueue import enqueue_op, enqueue_params, gated_op, key_params
from evq.worker import metrics
from evq.worker.approval_policy import (
    PRIORITIES,
    ApprovalPolicy,
    KeyApproval,
    applied,
    batch_counters,
    contact_holds,
    contact_keys,
    contacts,
    gated,
    going_out,
    key_approval,
    sender_of,
    static_holds,
)
from evq.worker.enqueue import existing_or_conflict, new_message_id, result_from_row
from evq.worker.errors import BudgetExceeded, Conflict
from evq.worker.records import EnqueueResult
from evq.worker.request import ValidRequest
from evq.worker.states import Status

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
