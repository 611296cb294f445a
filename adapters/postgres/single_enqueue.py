"""The enqueue of one request, as ops (op_runner.py): :func:`enqueue_op` (no approval policy in
force), :func:`gated_op` (judged by the approval rules and budgets, held or charged) and
:func:`preview_op` (what gated_op would hold, read without writing). The batch ops
(batch_enqueue.py) take one request at a time through these when they must, and share
:func:`enqueue_params` and :func:`key_params`; the Python API (enqueue.py) and the store
(store/steps.py) run them.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from datetime import datetime
from typing import Any

from evq.adapters.postgres.op_runner import Op, Rows
from evq.adapters.postgres.queries import Q
from evq.worker import metrics
from evq.worker.approval_policy import (
    PRIORITIES,
    ApprovalPolicy,
    OverBudget,
    applied,
    budget_charges,
    budget_hold,
    budget_refusal,
    contact_holds,
    contact_keys,
    contacts,
    going_out,
    memory_keys,
    sender_of,
    static_holds,
)
from evq.worker.enqueue import existing_or_conflict, new_message_id, result_from_row
from evq.worker.errors import Conflict
from evq.worker.request import ValidRequest


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
