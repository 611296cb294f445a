"""An in-memory store: the core's ports (``evq.worker.ports.Store``, and what the recorder,
rescuer, reconciler, rate gate and circuit breaker ask of a store) without PostgreSQL.

It follows adapters/postgres/queries.sql statement by statement: the same guards (state,
lease token, attempt), the same evidence rows, the same lease tokens (``md5(claim_id:id)``),
the same order of claims and of reconciler picks, the same failure notices (notice_candidates,
notice_enqueue) in the same call as the transition that owes them. The schema's CHECK constraints
(adapters/postgres/schema.py), the append-only evidence and the step guard of migration 0012
are checked on every write, so a path that would make PostgreSQL refuse a row makes this
store raise :class:`InvariantViolated` instead of writing it. tests/conformance runs one set
of tests against this store and PostgresStore: that suite, not this docstring, is what
keeps the two in agreement.

Where it does not (cannot honestly) match PostgreSQL:

- Concurrency: each operation runs without an ``await`` between its reads and its writes,
  so it is atomic in one event loop, as one statement is; there are no other processes,
  connections, locks or SKIP LOCKED, no lost answers and no database errors. Faults are
  injected by wrapping the store (as the PostgreSQL tests do), not simulated here.
- Time: ``now=None`` means this store's ``clock`` (``datetime.now(UTC)`` unless given),
  not a database clock shared by hosts. ``get_step``'s ``age_seconds`` uses it too.
- Ids are drawn as PostgreSQL's sequences draw them (a conflicting enqueue uses one up), but
  the evidence rows one statement writes for several steps are in the order of its pick,
  where PostgreSQL's follow its scan; nothing relies on that order.
- Migration 0012's guard does not exempt anyone here; in PostgreSQL the tables' owner
  (the tests' superuser) bypasses it. Every evq statement passes it either way.
- API keys: creating one, looking it up and rehashing it (worker/keys.py's port), not the
  revoke, list and sign-out of the ops tools. Retention follows evq_prune_batch (migration
  0009), its prune_log included, without the owner-only switch; the key ledger (step_keys,
  0026) is kept only for the keys of pruned steps (``pruned_keys``: a live step's key is its
  step's); content retention follows evq_redact_batch (0013), its cutoff on this store's clock.
- Not implemented: queue statistics, the LISTEN wakeup, the enqueue inside a caller's
  transaction, ``transaction()``. A row with the same lease token twice in one ``record``
  batch (the recorder never makes one) is not modelled.
- No metrics of the adapter's own (store latency); the closing histogram
  (``metrics.observe_closed``) is fed where PostgresStore feeds it.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import hashlib
import json
import math
import os
import re
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

from evq.worker import metrics
from evq.worker import window as windows
from evq.worker.approval import (
    PRIORITIES,
    WINDOW_SECONDS,
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
    memory_keys,
    sender_of,
    static_holds,
)
from evq.worker.approvals import not_cancellable, not_held, self_approval
from evq.worker.deadline import DEADLINE_SHARE
from evq.worker.delivery import (
    DELIVERY_TYPES,
    PROVES_ACCEPTED,
    TELLS_NOTIFY,
    DeliveryEvent,
    key_digest,
    message_tag,
    split_tag,
)
from evq.worker.enqueue import existing_or_conflict, new_message_id
from evq.worker.errors import AuthFailed, BudgetExceeded, Conflict, InvalidRequest, NotFound, StateConflict
from evq.worker.keys import NewKey, Role, default_approval, hash_secret
from evq.worker.logs import get_logger
from evq.worker.notices import NoticeConfig, build_delivery_notice, build_notice
from evq.worker.ports import COUNT_CAP, Decided, DeliveryRecorded, Edit, StatusCount, StepFilter
from evq.worker.pruner import step_not_found
from evq.worker.records import (
    BudgetKey,
    BudgetPrune,
    ClaimedStep,
    EnqueueResult,
    Grant,
    PartitionPrune,
    PruneCounts,
    RecordResult,
    RedactCounts,
    RescueCounts,
    Resolved,
    RunDetail,
    StepDetail,
    StepSummary,
    Transition,
    UnknownStep,
)
from evq.worker.refusals import INTERFACES as REFUSAL_INTERFACES
from evq.worker.refusals import Refusal
from evq.worker.request import ValidRequest
from evq.worker.resolution import Resolution, Verdict
from evq.worker.retry_guard import retry_after_acceptance, retry_after_redaction, retry_too_soon
from evq.worker.search import SearchTerms, search_terms
from evq.worker.states import Status

log = get_logger("evq.memstore")

STATUSES = frozenset(s.value for s in Status)
TERMINAL = frozenset({"accepted", "rejected"})
CLAIMABLE = frozenset({"pending", "retryable"})
ANSWERS = frozenset({"provider_response", "late_response"})
EVIDENCE_KINDS = frozenset(
    {
        "attempt_started",
        "provider_response",
        "late_response",
        "attempt_released",
        "lease_expired",
        "window_closed",
        "reconciled",
        "operator_resolved",
        "notice_enqueued",
        "content_redacted",
        "delivery_event",
        # 0018: the held lifecycle.
        "held",
        "approved",
        "denied",
        "cancelled",
        "hold_expired",
    }
)
OUTCOMES = frozenset({"accepted", "rejected", "retryable", "unknown"})
CIRCUIT_STATES = frozenset({"closed", "half_open", "open"})
# Migration 0012: what a step is, fixed at enqueue.
FIXED = (
    "id",
    "run_id",
    "step_id",
    "decision_id",
    "idempotency_key",
    "message_id",
    "provider",
    "notify",
    "created_at",
)
REQUEUE_REASONS = frozenset({"attempts_exhausted", "retry_budget_exhausted"})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_MESSAGE_ID = re.compile(r"^<[^<>@\s]+@[^<>@\s]+>$")


class InvariantViolated(Exception):
    """A write PostgreSQL would refuse (a CHECK constraint, a trigger, a unique index): a bug."""


def lease_token(claim_id: str, step_id: int) -> uuid.UUID:
    """``md5(claim_id || ':' || id)::uuid``, as step_claim derives it."""
    return uuid.UUID(hashlib.md5(f"{claim_id}:{step_id}".encode()).hexdigest())


def _secs(seconds: float) -> timedelta:
    return timedelta(seconds=float(seconds))


def _epoch(delta: timedelta) -> float:
    return delta.total_seconds()


def _json(value: Any) -> Any:
    """What a jsonb column gives back: a fresh copy, timestamps as ISO text."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=_json_default))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def _least(*values: Any) -> Any:
    """PostgreSQL's least(): NULLs ignored."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _coalesce(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _message(t: Transition) -> str | None:
    message = t.detail.get("message")
    return str(message)[:1000] if message is not None else None


def _check_step(row: Mapping[str, Any]) -> None:
    s = row["status"]
    checks = {
        "status": s in STATUSES,
        "closed_iff_terminal": (s in TERMINAL) == (row["closed_at"] is not None),
        "lease_iff_in_flight": (s == "in_flight")
        == (row["lease_token"] is not None and row["lease_owner"] is not None and row["lease_expires_at"] is not None),
        "unknown_since_iff_unknown": (s == "unknown") == (row["unknown_since"] is not None),
        "in_flight_counts_attempt": s != "in_flight" or row["attempts"] >= 1,
        "attempts_nonnegative": row["attempts"] >= 0,
        "max_attempts_positive": row["max_attempts"] is None or row["max_attempts"] >= 1,
        "first_attempt_iff_attempted": (row["attempts"] == 0) == (row["first_attempt_at"] is None),
        "payload_sha256_hex": bool(_SHA256.match(row["payload_sha256"])),
        "payload_object": isinstance(row["payload"], dict),
        "idempotency_key_length": 1 <= len(row["idempotency_key"]) <= 512,
        "message_id_format": bool(_MESSAGE_ID.match(row["message_id"])),
        "maybe_delivered_after_attempt": not row["maybe_delivered"] or row["attempts"] >= 1,
        "notice_never_notifies": row["notice_of"] is None or row["notify"] is None,
        "reconcile_checks_nonnegative": row["reconcile_checks"] >= 0,
        "uncharged_within_attempts": 0 <= row["uncharged_attempts"] <= row["attempts"],
        "next_attempt_at_not_null": row["next_attempt_at"] is not None,
        "redacted_only_when_closed": row["content_redacted_at"] is None or s in TERMINAL,
        "held_since_iff_held": (s == "held") == (row["held_since"] is not None),
        "hold_expiry_only_when_held": row["hold_expires_at"] is None or s == "held",
        "priority_range": -1 <= row["priority"] <= 1,
        "requested_sha256_hex": row["requested_sha256"] is None or bool(_SHA256.match(row["requested_sha256"])),
    }
    broken = [name for name, ok in checks.items() if not ok]
    if broken:
        raise InvariantViolated(f"step {row['id']}: violates ck_email_steps_{broken[0]} ({broken})")


def _guard_step(old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """evq_step_guard (migrations 0012, 0018)."""
    changed = [c for c in FIXED if old[c] != new[c]]
    if changed:
        raise InvariantViolated(f"step {old['id']}: what a step is is fixed at enqueue ({changed})")
    corrected = any(old[c] != new[c] for c in ("payload", "payload_sha256", "requested_sha256"))
    approving = old["status"] == "held" and new["status"] == "pending"
    if corrected and not (approving and new["requested_sha256"] == (old["requested_sha256"] or old["payload_sha256"])):
        raise InvariantViolated(f"step {old['id']}: a request is corrected only as its held send is approved")
    if new["status"] == "held" and old["status"] != "held":
        raise InvariantViolated(f"step {old['id']}: a send is held only at enqueue")
    if old["status"] == "accepted" and new["status"] != "accepted":
        raise InvariantViolated(f"step {old['id']} was accepted: it cannot become {new['status']}")
    if (
        old["status"] == "rejected"
        and new["status"] != "rejected"
        and not (new["status"] == "retryable" and old["reason"] in REQUEUE_REASONS)
    ):
        raise InvariantViolated(f"step {old['id']} was rejected ({old['reason']}): only a requeue may reopen it")
    # evq_content_guard (migration 0013); here every write is evq's own, and only the
    # redaction (``_redact``, which bypasses this guard as the owner's function does) sets it.
    if new["content_redacted_at"] != old["content_redacted_at"]:
        raise InvariantViolated(f"step {old['id']}: only evq_redact_batch marks content redacted")
    if old["content_redacted_at"] is not None and new["status"] != old["status"]:
        raise InvariantViolated(f"step {old['id']}: its content was redacted: it cannot be sent again")


def _check_circuit(row: Mapping[str, Any]) -> None:
    s = row["state"]
    ok = (
        s in CIRCUIT_STATES
        and (s == "closed") == (row["opened_at"] is None)
        and (s == "open") == (row["probe_at"] is not None)
        and (s == "half_open") == (row["probe_owner"] is not None and row["probe_expires_at"] is not None)
        and row["probes"] >= 0
    )
    if not ok:
        raise InvariantViolated(f"circuit {row['provider']}: violates a ck_provider_circuits constraint: {row}")


class MemoryStore:
    """The Store port in memory; see the module docstring for where it differs from PostgreSQL."""

    def __init__(
        self, *, notices: NoticeConfig = NoticeConfig(), clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ):
        self.notices = notices
        self.clock = clock
        self.steps: dict[int, dict[str, Any]] = {}
        self.decisions: dict[int, dict[str, Any]] = {}
        # Append-only: rows are read-only mappings, and nothing removes one.
        self.evidence: list[Mapping[str, Any]] = []
        self.rate_limits: dict[str, dict[str, Any]] = {}
        self.circuit_rows: dict[str, dict[str, Any]] = {}
        self.circuit_events: list[Mapping[str, Any]] = []
        self.feed: list[Mapping[str, Any]] = []  # append-only, like evidence
        self.deliveries: list[Mapping[str, Any]] = []  # delivery_events (0017): append-only
        self._step_ids = 0
        self._decision_ids = 0
        self._evidence_ids = 0
        self._event_ids = 0
        self.keys: dict[str, dict[str, Any]] = {}  # by name, in creation order
        self.pepper = os.urandom(32)  # api_key_pepper: made by the migration, never changed
        self.prune_log: list[Mapping[str, Any]] = []
        self.pruned_keys: dict[str, dict[str, Any]] = {}  # step_keys (0026) of pruned steps: key -> its end
        self.refusals: list[dict[str, Any]] = []  # enqueue_refusals, by id
        self.refusal_counts: dict[tuple[str, str], int] = {}  # enqueue_refusal_counts: never pruned
        self.calls: list[str] = []  # operation names, in order (what PostgresStore would time)
        self.send_budgets: dict[tuple[str, str, datetime], int] = {}  # (budget, scope, window) -> used
        self.budgets_charged: dict[tuple[str, str, datetime], datetime] = {}  # send_budgets.updated_at
        # known_recipients (0018): (sender, address or @domain) -> the first step that made it known.
        self.known_recipients: dict[tuple[str, str], int] = {}  # (sender, recipient) -> first step
        self.queue_samples: dict[datetime, dict[str, Any]] = {}  # queue_samples (0019), by minute
        self.rollup_upto: datetime | None = None  # send_rollup_watermark.upto (0020)

    async def close(self) -> None:
        return None

    # -- internals ------------------------------------------------------------------

    async def _op(self, name: str, now: datetime | None) -> datetime:
        # One turn of the loop, as any statement's round trip gives, so the core's tasks
        # interleave; nothing below awaits again, so the operation itself is atomic.
        await asyncio.sleep(0)
        self.calls.append(name)
        return now if now is not None else self.clock()

    def _update(self, row: dict[str, Any], **changes: Any) -> None:
        new = {**row, **changes}
        _guard_step(row, new)
        _check_step(new)
        row.update(changes)

    def _insert_evidence(self, **fields: Any) -> Mapping[str, Any] | None:
        """One evidence row; None when the answer-per-lease index already holds this lease
        (the caller decides whether that is ON CONFLICT DO NOTHING or an error)."""
        row = {
            "step_id": None,
            "run_id": None,
            "attempt": None,
            "kind": None,
            "actor": None,
            "from_status": None,
            "to_status": None,
            "outcome": None,
            "reason": None,
            "provider_message_id": None,
            "lease_token": None,
            "latency_ms": None,
            "detail": {},
            "created_at": None,
            **fields,
        }
        row["detail"] = _json(row["detail"] if row["detail"] is not None else {})
        ok = (
            row["kind"] in EVIDENCE_KINDS
            and row["step_id"] in self.steps
            and row["actor"] is not None
            and row["created_at"] is not None
            and (row["outcome"] is None or row["outcome"] in OUTCOMES)
            and (row["from_status"] is None or row["from_status"] in STATUSES)
            and (row["to_status"] is None or row["to_status"] in STATUSES)
            and (
                row["kind"] not in ("attempt_started", "provider_response", "late_response")
                or (row["attempt"] is not None and row["lease_token"] is not None)
            )
        )
        if not ok:
            raise InvariantViolated(f"evidence violates a ck_evidence constraint: {row}")
        if row["kind"] in ANSWERS and any(
            e["kind"] in ANSWERS and e["lease_token"] == row["lease_token"] for e in self.evidence
        ):
            return None
        self._evidence_ids += 1
        frozen = MappingProxyType({"id": self._evidence_ids, **row})
        self.evidence.append(frozen)
        self._key_event(frozen)
        return frozen

    def _key_event(self, e: Mapping[str, Any]) -> None:
        """The evidence_key_events trigger (0015): a rejection, unknown or verdict on an
        agent's step lands in the feed of the key that enqueued it."""
        moved = e["to_status"] in ("rejected", "unknown") and e["from_status"] != e["to_status"]
        if not (moved or e["kind"] == "operator_resolved"):
            return
        step = self.steps[e["step_id"]]
        if step["notice_of"] is not None:
            return
        detail = e["detail"] or {}
        text = detail.get("message") if detail.get("message") is not None else detail.get("note")
        self.feed.append(
            MappingProxyType(
                {
                    "id": len(self.feed) + 1,
                    "key_id": self.decisions[step["decision_id"]]["actor_key_id"],
                    "kind": "verdict" if e["kind"] == "operator_resolved" else e["to_status"],
                    "step": step["id"],
                    "run_id": step["run_id"],
                    "step_id": step["step_id"],
                    "status": e["to_status"],
                    "reason": e["reason"],
                    "detail": None if text is None else str(text)[:1000],
                    "actor": e["actor"],
                    "evidence_id": e["id"],
                    "created_at": e["created_at"],
                }
            )
        )

    def _evidence_of(self, step_id: int) -> list[Mapping[str, Any]]:
        return [e for e in self.evidence if e["step_id"] == step_id]

    def _claimable(self, row: Mapping[str, Any], now: datetime, lease_seconds: float) -> bool:
        """The claim's filter, circuits aside."""
        window_closed = row["dedupe_until"] is None or row["dedupe_until"] <= now + _secs(lease_seconds)
        return (
            row["status"] in CLAIMABLE
            and row["next_attempt_at"] <= now
            and not (row["maybe_delivered"] and window_closed)
        )

    def _circuit_held(self, provider: str) -> bool:
        c = self.circuit_rows.get(provider)
        return c is not None and c["state"] != "closed"

    # -- enqueue --------------------------------------------------------------------

    async def enqueue(
        self, request: ValidRequest, *, now: datetime | None = None, approval: ApprovalPolicy = ApprovalPolicy()
    ) -> EnqueueResult:
        at = await self._op("enqueue", now)
        if gated(approval, [request]):
            return self._gated(request, at, approval)
        return self._enqueue(request, at)

    async def enqueue_many(
        self,
        requests: Sequence[ValidRequest],
        *,
        now: datetime | None = None,
        approval: ApprovalPolicy = ApprovalPolicy(),
    ) -> list[EnqueueResult]:
        at = await self._op("enqueue_many", now)
        # All or nothing, as the batch's transaction is.
        # Sequences are not transactional: the ids a failed batch took stay taken.
        saved = copy.deepcopy(
            (self.steps, self.decisions, self.send_budgets, self.budgets_charged, self.known_recipients)
        )
        evidence = len(self.evidence)
        try:
            if not gated(approval, requests):
                results = []
                for r in requests:
                    drawn = self._step_ids
                    results.append(self._enqueue(r, at))
                    if self._step_ids == drawn:  # step_enqueue_many draws both ids for every request
                        self._decision_ids += 1
                        self._step_ids += 1
                return results
            # gated_many_op locks every counter the batch may charge first (budget_lock).
            self._touch_budgets(batch_counters(approval, requests, now=at), at, made_only=True)
            results = []
            for i, r in enumerate(requests):
                try:
                    results.append(self._gated(r, at, approval))
                except BudgetExceeded as exc:
                    raise BudgetExceeded(
                        [{**e, "field": f"[{i}].{e['field']}"} for e in exc.errors], hint=exc.hint
                    ) from None
            return results
        except BaseException:
            self.steps, self.decisions, self.send_budgets, self.budgets_charged, self.known_recipients = saved
            del self.evidence[evidence:]  # the transaction's own rows, gone with it
            raise

    def _gated(self, request: ValidRequest, at: datetime, approval: ApprovalPolicy) -> EnqueueResult:
        """gated_op (adapters/postgres/enqueue.py): a new step judged by the policy; a repeat
        of a stored key answered as its row is, charging nothing."""
        holder = self._holder(request)
        if holder is not None:
            return existing_or_conflict({**holder, "created": False}, request)
        holds, charges, given_back = self._judge(request, at, approval, refuse=True)
        self._touch_budgets([(b, s, w) for b, s, w, _a, _c in given_back], at, made_only=False)
        hold = {"rules": holds} if holds else None
        result = self._enqueue(request, at, hold=hold, expires=approval.expires_after)
        for budget, scope, window, amount, _cap in charges:
            self.send_budgets[(budget, scope, window)] = self.send_budgets.get((budget, scope, window), 0) + amount
            self.budgets_charged[(budget, scope, window)] = at
        if hold is not None:
            actor = request.actor
            who = (actor.name or actor.interface) if actor else "python"
            self._insert_evidence(
                step_id=result.id,
                run_id=result.run_id,
                kind="held",
                actor=who,
                reason="approval_required",
                detail=hold,
                created_at=at,
            )
        else:
            for k in memory_keys(request.recipients):
                self.known_recipients.setdefault((sender_of(request.payload), k), result.id)
        return result

    def _judge(
        self, request: ValidRequest, at: datetime, approval: ApprovalPolicy, *, refuse: bool
    ) -> tuple[
        list[dict[str, Any]], list[tuple[str, str, datetime, int, int]], list[tuple[str, str, datetime, int, int]]
    ]:
        """The holds the policy gives a new step, the budget charges it would make (none when held),
        and, held by a budget, the charges before the one over its cap (made and given back)."""
        approval = applied(approval, request)
        sender = sender_of(request.payload)
        keys = contact_keys(approval, contacts(request.recipients, request.notify))
        known = [k for k in keys if (sender, k) in self.known_recipients]
        when = going_out(at, request.send_at)
        holds = static_holds(
            approval, recipients=len(request.recipients), now=when, requested=request.require_approval
        ) + contact_holds(approval, keys, known)
        if holds:
            return holds, [], []
        name = request.actor.name if request.actor else None
        charges = budget_charges(approval, run_id=request.run_id, actor=name, recipients=request.recipients, now=when)
        # Check, then charge: nothing here interleaves (the counters' row locks, in PostgreSQL).
        for i, charge in enumerate(charges):
            budget, scope, window, amount, cap = charge
            used = self.send_budgets.get((budget, scope, window), 0)
            if used + amount > cap:
                over = budget_hold(charge, used)
                if refuse and approval.over_budget is OverBudget.REFUSE:
                    raise budget_refusal(over)
                # gated_op charged the counters before this one, then gave them back.
                return [over], [], charges[:i]
        return [], charges, []

    def _touch_budgets(self, keys: Sequence[tuple[str, str, datetime]], at: datetime, *, made_only: bool) -> None:
        """Counters PostgreSQL writes and leaves at what they held: a charge given back
        (budget_charge then budget_uncharge: its updated_at moves) or a batch's lock
        (budget_lock: a row at 0 if there was none, updated_at unchanged otherwise)."""
        for k in keys:
            if k not in self.send_budgets:
                self.send_budgets[k] = 0
            elif made_only:
                continue
            self.budgets_charged[k] = at

    async def preview_holds(
        self, request: ValidRequest, approval: ApprovalPolicy, *, now: datetime | None = None
    ) -> list[dict[str, Any]]:
        at = await self._op("preview_holds", now)
        return self._judge(request, at, approval, refuse=False)[0]  # reads only

    def _holder(self, request: ValidRequest) -> dict[str, Any] | None:
        """step_get_by_key: the row holding the key, else the pruned step's, else the run and step ids."""
        by_key = [s for s in self.steps.values() if s["idempotency_key"] == request.idempotency_key]
        pruned = [p for p in [self.pruned_keys.get(request.idempotency_key)] if p is not None]
        by_ids = [s for s in self.steps.values() if (s["run_id"], s["step_id"]) == (request.run_id, request.step_id)]
        return (by_key or pruned or by_ids or [None])[0]

    async def budget_usage(self, *, now: datetime | None = None, limit: int = 20) -> list[dict[str, Any]]:
        at = (await self._op("budget_usage", now)).astimezone(UTC)
        hour = at.replace(minute=0, second=0, microsecond=0)
        day = hour.replace(hour=0)
        current = {"key_hourly": hour, "domain_hourly": hour, "key_daily": day}
        rows = [
            {"budget": b, "scope": s, "window_start": w, "used": used}
            for (b, s, w), used in self.send_budgets.items()
            if used > 0 and (b == "run_recipients" or current.get(b) == w)
        ]
        return sorted(rows, key=lambda r: (-r["used"], r["budget"], r["scope"]))[:limit]

    def _enqueue(
        self,
        request: ValidRequest,
        at: datetime,
        *,
        notice_of: int | None = None,
        tool: str | None = None,
        hold: dict[str, Any] | None = None,
        expires: timedelta | None = None,
    ) -> EnqueueResult:
        message_id = new_message_id(request)
        taken = next(
            (
                s
                for s in self.steps.values()
                if s["idempotency_key"] == request.idempotency_key
                or s["message_id"] == message_id
                or (s["run_id"], s["step_id"]) == (request.run_id, request.step_id)
            ),
            None,
        )
        if taken is not None:
            # step_enqueue's ON CONFLICT DO NOTHING, then the row holding the key (or the
            # run_id/step_id, step_get_by_key): the same request gets it back, another is refused.
            # A pruned step's key is answered from the key ledger before the run_id/step_id's holder.
            held = next((s for s in self.steps.values() if s["idempotency_key"] == request.idempotency_key), None)
            held = held or self.pruned_keys.get(request.idempotency_key) or taken
            return existing_or_conflict({**held, "created": False}, request)
        # Both ids are drawn once the key ledger's insert is tried (step_enqueue skips it when a
        # step holds the key or the ids), so a repeat of a pruned key leaves a gap, as in PostgreSQL.
        self._decision_ids += 1
        self._step_ids += 1
        if request.idempotency_key in self.pruned_keys:  # the key ledger: a pruned step's key
            return existing_or_conflict({**self.pruned_keys[request.idempotency_key], "created": False}, request)
        d = request.decision
        row = {
            "id": self._step_ids,
            "run_id": request.run_id,
            "step_id": request.step_id,
            "decision_id": self._decision_ids,
            "idempotency_key": request.idempotency_key,
            "message_id": message_id,
            "provider": request.provider,
            "payload": json.loads(request.payload_json),
            "payload_sha256": request.payload_sha256,
            "status": "pending" if hold is None else "held",
            "reason": None if hold is None else "approval_required",
            "detail": None,
            "attempts": 0,
            "max_attempts": request.max_attempts,
            "next_attempt_at": max(at, request.send_at) if request.send_at is not None else at,
            "lease_owner": None,
            "lease_token": None,
            "lease_expires_at": None,
            "dedupe_until": None,
            "maybe_delivered": False,
            "provider_message_id": None,
            "notify": request.notify,
            "notice_of": notice_of,
            "reconcile_after": None,
            "reconcile_checks": 0,
            "created_at": at,
            "updated_at": at,
            "first_attempt_at": None,
            "unknown_since": None,
            "closed_at": None,
            "uncharged_attempts": 0,
            "retry_from": request.send_at if request.send_at is not None and request.send_at > at else None,
            "content_redacted_at": None,
            "priority": PRIORITIES[request.priority],
            "send_at": request.send_at,
            "held_since": None if hold is None else at,
            "hold_expires_at": at + expires if hold is not None and expires is not None else None,
            "hold": hold,
            "requested_sha256": None,
        }
        _check_step(row)
        self.decisions[self._decision_ids] = {
            "id": self._decision_ids,
            "run_id": request.run_id,
            "step_id": request.step_id,
            "intent": d.intent,
            "instruction_version": d.instruction_version,
            "prompt_version": d.prompt_version,
            "model": d.model,
            "tool": tool or d.tool,
            "rationale": None if d.rationale is None else _json(d.rationale),
            "decided_at": at if notice_of is not None else d.decided_at,
            "created_at": at,
            "actor": request.actor.name if request.actor else None,
            "actor_key_id": request.actor.key_id if request.actor else None,
            "interface": request.actor.interface if request.actor else None,
        }
        self.steps[row["id"]] = row
        return EnqueueResult(
            id=row["id"],
            run_id=row["run_id"],
            step_id=row["step_id"],
            idempotency_key=row["idempotency_key"],
            message_id=message_id,
            status=Status(row["status"]),
            created=True,
            provider=request.provider,
            hold=hold,
            hold_expires_at=row["hold_expires_at"],
        )

    async def find_by_key(self, request: ValidRequest) -> dict[str, Any] | None:
        await self._op("find_by_key", None)
        found = self._holder(request)
        if found is None:
            return None
        keys = (
            "id",
            "run_id",
            "step_id",
            "idempotency_key",
            "message_id",
            "status",
            "reason",
            "maybe_delivered",
            "payload_sha256",
            "provider",
            "created_at",
            "hold",
            "requested_sha256",
        )
        return {**{k: found[k] for k in keys}, "created": False, "pruned": bool(found.get("pruned"))}

    # -- the worker's transitions ---------------------------------------------------

    async def claim(
        self,
        *,
        owner: str,
        providers: Sequence[str],
        limit: int,
        lease_seconds: float,
        dedupe_windows: Mapping[str, float],
        claim_id: str | None = None,
        probe: bool = False,
        now: datetime | None = None,
    ) -> list[ClaimedStep]:
        at = await self._op("claim", now)
        claim_id = claim_id or uuid.uuid4().hex
        picked = sorted(
            (
                s
                for s in self.steps.values()
                if s["provider"] in providers
                and self._claimable(s, at, lease_seconds)
                and (probe or not self._circuit_held(s["provider"]))
            ),
            key=lambda s: (-s["priority"], s["next_attempt_at"], s["id"]),
        )[:limit]
        claimed = []
        # Evidence in the order of the pick, as the UPDATE's rows come (in practice) in
        # PostgreSQL; the answer in id order, as step_claim's ORDER BY id returns it.
        for s in picked:
            from_status = s["status"]
            window = dedupe_windows.get(s["provider"])
            first = s["first_attempt_at"] if s["first_attempt_at"] is not None else at
            self._update(
                s,
                status="in_flight",
                attempts=s["attempts"] + 1,
                lease_owner=owner,
                lease_token=lease_token(claim_id, s["id"]),
                lease_expires_at=at + _secs(lease_seconds),
                first_attempt_at=first,
                dedupe_until=_least(s["dedupe_until"], None if window is None else first + _secs(window)),
                updated_at=at,
            )
            self._insert_evidence(
                step_id=s["id"],
                run_id=s["run_id"],
                attempt=s["attempts"],
                kind="attempt_started",
                actor=owner,
                from_status=from_status,
                to_status="in_flight",
                lease_token=s["lease_token"],
                created_at=at,
            )
            retry_from = s["retry_from"] if s["retry_from"] is not None else s["created_at"]
            claimed.append(
                ClaimedStep(
                    id=s["id"],
                    run_id=s["run_id"],
                    step_id=s["step_id"],
                    idempotency_key=s["idempotency_key"],
                    message_id=s["message_id"],
                    provider=s["provider"],
                    payload=copy.deepcopy(s["payload"]),
                    attempt=s["attempts"],
                    max_attempts=s["max_attempts"],
                    lease_token=s["lease_token"],
                    lease_seconds=float(lease_seconds),
                    dedupe_remaining=None if s["dedupe_until"] is None else _epoch(s["dedupe_until"] - at),
                    maybe_delivered=s["maybe_delivered"],
                    created_at=s["created_at"],
                    uncharged_attempts=s["uncharged_attempts"],
                    budget_age=_epoch(at - retry_from),
                )
            )
        return sorted(claimed, key=lambda c: c.id)

    async def record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]:
        at = await self._op("record", now)
        if not transitions:
            return []
        applied: list[RecordResult] = []
        fenced: list[Transition] = []
        for t in transitions:
            s = self.steps.get(t.step_id)
            if (
                s is None
                or s["status"] != "in_flight"
                or s["lease_token"] != t.lease_token
                or s["attempts"] != t.attempt
            ):
                fenced.append(t)
                continue
            to = str(t.to_status)
            self._update(
                s,
                status=to,
                uncharged_attempts=s["uncharged_attempts"] + (0 if t.charged else 1),
                reason=str(t.reason),
                detail=_message(t),
                provider_message_id=_coalesce(t.provider_message_id, s["provider_message_id"]),
                maybe_delivered=t.maybe_delivered,
                next_attempt_at=at + _secs(t.retry_delay) if to == "retryable" else s["next_attempt_at"],
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
                unknown_since=at if to == "unknown" else None,
                closed_at=at if to in TERMINAL else None,
                updated_at=at,
            )
            answer = self._insert_evidence(
                step_id=t.step_id,
                run_id=s["run_id"],
                attempt=t.attempt,
                kind="provider_response",
                actor=actor,
                from_status="in_flight",
                to_status=to,
                outcome=t.outcome,
                reason=str(t.reason),
                provider_message_id=t.provider_message_id,
                lease_token=t.lease_token,
                latency_ms=t.latency_ms,
                detail=t.detail,
                created_at=at,
            )
            if answer is None:
                raise InvariantViolated(f"a second answer for lease {t.lease_token} (uq_evidence_answer_per_lease)")
            applied.append(RecordResult(step_id=t.step_id, applied=True))
        results = applied + [self._record_late(t, actor, at) for t in fenced]
        if self.notices.due([t.to_status for t in transitions], [t.reason for t in transitions]):
            self._enqueue_notices([r.step_id for r in results if r.applied or r.settled], actor=actor, at=at)
        return results

    def _record_late(self, t: Transition, actor: str, at: datetime) -> RecordResult:
        """step_record_late for one fenced answer."""
        s = self.steps.get(t.step_id)
        if s is None:
            return RecordResult(step_id=t.step_id, applied=False, settled=False, duplicate=True)
        to = str(t.to_status)
        settles = (
            to in TERMINAL
            and s["status"] in ("unknown", "retryable")
            and s["attempts"] == t.attempt
            and not any(e["lease_token"] == t.lease_token and e["kind"] in ANSWERS for e in self.evidence)
        )
        late = self._insert_evidence(
            step_id=t.step_id,
            run_id=s["run_id"],
            attempt=t.attempt,
            kind="late_response",
            actor=actor,
            from_status=s["status"],
            to_status=to if settles else None,
            outcome=t.outcome,
            reason="late_answer" if settles else str(t.reason),
            provider_message_id=t.provider_message_id,
            lease_token=t.lease_token,
            latency_ms=t.latency_ms,
            detail={**_json(t.detail), "fenced": True, "row_attempts": s["attempts"], "settled": settles},
            created_at=at,
        )
        if late is None:
            return RecordResult(step_id=t.step_id, applied=False, settled=False, duplicate=True)
        if settles:
            self._update(
                s,
                status=to,
                reason="late_answer",
                detail=_message(t),
                provider_message_id=_coalesce(t.provider_message_id, s["provider_message_id"]),
                unknown_since=None,
                closed_at=at,
                updated_at=at,
            )
        return RecordResult(step_id=t.step_id, applied=False, settled=settles, duplicate=False)

    async def release(self, steps: Sequence[ClaimedStep], *, actor: str, now: datetime | None = None) -> int:
        at = await self._op("release", now)
        return self._release([(s.id, s.lease_token, s.attempt) for s in steps], actor=actor, at=at)

    async def release_orphans(
        self, *, owner: str, held: Sequence[Any], claims: Sequence[str], now: datetime | None = None
    ) -> int:
        at = await self._op("release_orphans", now)
        if not claims:
            return 0
        keep = {str(t) for t in held}
        orphans = [
            (s["id"], s["lease_token"], s["attempts"])
            for s in self.steps.values()
            if s["status"] == "in_flight"
            and s["lease_owner"] == owner
            and any(s["lease_token"] == lease_token(c, s["id"]) for c in claims)
            and str(s["lease_token"]) not in keep
        ]
        return self._release(orphans, actor=owner, at=at)

    def _release(self, held: Sequence[tuple[int, Any, int]], *, actor: str, at: datetime) -> int:
        released = 0
        for step_id, token, attempt in held:
            s = self.steps.get(step_id)
            if s is None or s["status"] != "in_flight" or s["lease_token"] != token or s["attempts"] != attempt:
                continue
            first = s["attempts"] == 1
            self._update(
                s,
                status="pending" if first else "retryable",
                attempts=s["attempts"] - 1,
                first_attempt_at=None if first else s["first_attempt_at"],
                dedupe_until=None if first else s["dedupe_until"],
                reason="released",
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
                next_attempt_at=at,
                updated_at=at,
            )
            self._insert_evidence(
                step_id=step_id,
                run_id=s["run_id"],
                attempt=attempt,
                kind="attempt_released",
                actor=actor,
                from_status="in_flight",
                to_status=s["status"],
                reason="released",
                lease_token=token,
                created_at=at,
            )
            released += 1
        return released

    async def rescue(
        self, *, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None = None
    ) -> RescueCounts:
        at = await self._op("rescue", now)
        expired = sorted(
            (s for s in self.steps.values() if s["status"] == "in_flight" and s["lease_expires_at"] < at),
            key=lambda s: (s["lease_expires_at"], s["id"]),
        )[:limit]
        unknown: list[int] = []
        retryable = 0
        for s in expired:
            max_attempts = s["max_attempts"] if s["max_attempts"] is not None else default_max_attempts
            window_open = s["dedupe_until"] is not None and s["dedupe_until"] > at + _secs(lease_seconds)
            to = "retryable" if window_open and s["attempts"] - s["uncharged_attempts"] < max_attempts else "unknown"
            token, owner, expires = s["lease_token"], s["lease_owner"], s["lease_expires_at"]
            self._update(
                s,
                status=to,
                reason="lease_expired",
                detail=f"lease held by {owner} expired during attempt {s['attempts']}",
                maybe_delivered=True,
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
                unknown_since=at if to == "unknown" else None,
                next_attempt_at=at,
                updated_at=at,
            )
            self._insert_evidence(
                step_id=s["id"],
                run_id=s["run_id"],
                attempt=s["attempts"],
                kind="lease_expired",
                actor=actor,
                from_status="in_flight",
                to_status=to,
                reason="lease_expired",
                lease_token=token,
                detail={"lease_owner": owner, "lease_expired_at": expires},
                created_at=at,
            )
            if to == "unknown":
                unknown.append(s["id"])
            else:
                retryable += 1
        # step_close_windows
        closing = [
            s
            for s in sorted(self.steps.values(), key=lambda s: s["id"])
            if s["status"] == "retryable"
            and s["maybe_delivered"]
            and (s["dedupe_until"] is None or s["dedupe_until"] <= at + _secs(lease_seconds))
        ][:limit]
        for s in closing:
            self._update(
                s,
                status="unknown",
                reason="dedupe_window_closed",
                detail="the provider no longer deduplicates this key; another attempt could send a second copy",
                unknown_since=at,
                updated_at=at,
            )
            self._insert_evidence(
                step_id=s["id"],
                run_id=s["run_id"],
                attempt=s["attempts"],
                kind="window_closed",
                actor=actor,
                from_status="retryable",
                to_status="unknown",
                reason="dedupe_window_closed",
                detail={"dedupe_until": s["dedupe_until"]},
                created_at=at,
            )
        if Status.UNKNOWN in self.notices.statuses:
            self._enqueue_notices(unknown + [s["id"] for s in closing], actor=actor, at=at)
        return RescueCounts(unknown=len(unknown), retryable=retryable, window_closed=len(closing))

    async def claimable_exists(
        self, *, providers: Sequence[str], lease_seconds: float, now: datetime | None = None
    ) -> bool:
        at = await self._op("claimable_exists", now)

        def held(provider: str) -> bool:
            c = self.circuit_rows.get(provider)
            if c is None or c["state"] == "closed":
                return False
            probe_due = (c["state"] == "open" and c["probe_at"] <= at) or (
                c["state"] == "half_open" and c["probe_expires_at"] < at
            )
            return not probe_due

        return any(
            s["provider"] in providers and self._claimable(s, at, lease_seconds) and not held(s["provider"])
            for s in self.steps.values()
        )

    async def waiting(self, *, providers: Sequence[str], now: datetime | None = None) -> list[dict[str, Any]]:
        at = await self._op("waiting", now)
        out: dict[str, dict[str, Any]] = {}
        for s in self.steps.values():
            if s["provider"] not in providers or s["status"] not in (*CLAIMABLE, Status.HELD):
                continue
            row = out.setdefault(s["provider"], {"provider": s["provider"], "due": 0, "later": 0, "next_at": None})
            row.setdefault("held", 0)
            if s["status"] == Status.HELD:
                row["held"] += 1
            elif s["next_attempt_at"] <= at:
                row["due"] += 1
            else:
                row["later"] += 1
                row["next_at"] = min(filter(None, (row["next_at"], s["next_attempt_at"])))
        return [out[p] for p in sorted(out)]

    # -- failure notices (adapters/postgres/notices.py) -------------------------------

    async def enqueue_notices(
        self, step_ids: Sequence[int], *, actor: str, now: datetime | None = None
    ) -> list[tuple[int, int]]:
        at = await self._op("notices", now)
        return self._enqueue_notices(step_ids, actor=actor, at=at)

    def _notice_enqueued(self, notice: ValidRequest, step_id: int, *, actor: str, at: datetime) -> int:
        """Enqueue a built notice about ``step_id`` with its evidence (as statement notice_enqueue); its id."""
        kind = notice.decision.rationale["status"]
        made = self._enqueue(notice, at, notice_of=step_id, tool="evq-notice")
        to = notice.payload["to"][0]["email"]
        self._insert_evidence(
            step_id=step_id,
            run_id=notice.run_id,
            kind="notice_enqueued",
            actor=actor,
            reason=kind,
            detail={
                "notice_step": made.id,
                "notice_key": made.idempotency_key,
                "to": to,
                "message": f"notice of {kind} queued as step {made.id} to {to}",
            },
            created_at=at,
        )
        metrics.NOTICES.inc()
        return made.id

    def _enqueue_notices(self, step_ids: Sequence[int], *, actor: str, at: datetime) -> list[tuple[int, int]]:
        statuses = {str(s) for s in self.notices.statuses}
        created: list[tuple[int, int]] = []
        for step_id in sorted(set(step_ids)):
            s = self.steps.get(step_id)
            if s is None or s["notice_of"] is not None:
                continue
            # The enqueuing key's default target when the request named none (notice_candidates).
            key_id = self.decisions[s["decision_id"]]["actor_key_id"]
            key = next((k for k in self.keys.values() if key_id is not None and k["key_id"] == key_id), None)
            notify = s["notify"] or (key or {}).get("notify_email")
            if notify is None:
                continue
            notify_key = key["name"] if key is not None and s["notify"] is None else None
            partial = s["status"] == "accepted" and s["reason"] == "partially_refused"
            if s["status"] not in statuses and not partial:
                continue
            if self._unvouched_notify(s):
                continue  # notice_candidates: a stranger is never told on a held request's word
            answers = [e for e in self._evidence_of(step_id) if e["outcome"] == "accepted" and e["kind"] in ANSWERS]
            refused = answers[-1]["detail"].get("refused") if partial and answers else None
            try:
                notice = build_notice(
                    {**s, "notify": notify, "notify_key": notify_key, "refused": refused}, self.notices
                )
            except InvalidRequest as exc:
                log.error("notice_not_built", step=step_id, error=exc.message, fields=exc.errors)
                continue
            if notice.idempotency_key in self.pruned_keys or any(
                n["idempotency_key"] == notice.idempotency_key
                or (n["run_id"], n["step_id"]) == (notice.run_id, notice.step_id)
                for n in self.steps.values()
            ):
                continue  # ON CONFLICT DO NOTHING: this transition's notice exists
            created.append((self._notice_enqueued(notice, step_id, actor=actor, at=at), step_id))
        return created

    # -- provider rate limits (worker/ratelimit.py) -----------------------------------

    async def rate_take(
        self, *, provider: str, per_second: float, burst: int, want: int, now: datetime | None = None
    ) -> Grant:
        at = await self._op("rate_take", now)
        b = self.rate_limits.setdefault(provider, {"tokens": float(burst), "refilled_at": at, "paused_until": None})
        available = min(float(burst), b["tokens"] + per_second * max(0.0, _epoch(at - b["refilled_at"])))
        paused = b["paused_until"] is not None and b["paused_until"] > at
        granted = 0 if paused else min(want, math.floor(available))
        b["tokens"] = available - granted
        b["refilled_at"] = max(b["refilled_at"], at)
        if b["tokens"] < 0:
            raise InvariantViolated("ck_provider_rate_limits_tokens_not_negative")
        return Grant(
            granted=granted,
            paused_for=_epoch(b["paused_until"] - at) if paused else 0.0,
            next_token_in=max(0.0, (1 - (available - granted)) / per_second) if granted < want and not paused else 0.0,
        )

    async def rate_refund(self, *, provider: str, burst: int, tokens: int, now: datetime | None = None) -> None:
        await self._op("rate_refund", now)
        b = self.rate_limits.get(provider)
        if b is not None:
            b["tokens"] = min(float(burst), b["tokens"] + tokens)

    async def rate_pause(self, *, provider: str, seconds: float, now: datetime | None = None) -> float:
        at = await self._op("rate_pause", now)
        until = at + _secs(seconds)
        b = self.rate_limits.get(provider)
        if b is None:
            b = self.rate_limits[provider] = {"tokens": 0.0, "refilled_at": at, "paused_until": until}
        else:
            # greatest(): a pause only ever grows, and NULL is ignored.
            b["paused_until"] = until if b["paused_until"] is None else max(b["paused_until"], until)
        return _epoch(b["paused_until"] - at)

    # -- provider circuits (worker/circuit.py) ----------------------------------------

    def _circuit_event(self, **fields: Any) -> None:
        if fields["from_state"] not in CIRCUIT_STATES or fields["to_state"] not in CIRCUIT_STATES:
            raise InvariantViolated(f"a provider_circuit_events state is not a state: {fields}")
        self._event_ids += 1
        self.circuit_events.append(
            MappingProxyType({"id": self._event_ids, "reason": None, "detail": None, "probe_in": None, **fields})
        )

    def _set_circuit(self, row: dict[str, Any], **changes: Any) -> None:
        new = {**row, **changes}
        _check_circuit(new)
        row.update(changes)

    async def circuit_trip(
        self,
        *,
        provider: str,
        reason: str,
        detail: str,
        actor: str,
        probe_base: float,
        probe_max: float,
        now: datetime | None = None,
    ) -> dict[str, Any] | None:
        at = await self._op("circuit_trip", now)
        c = self.circuit_rows.setdefault(provider, self._closed_circuit(provider, at))
        if c["state"] == "open":
            return None
        from_state = c["state"]
        probes = c["probes"] + 1 if from_state == "half_open" else 0
        probe_in = min(probe_max, probe_base * math.pow(2.0, probes))
        self._set_circuit(
            c,
            state="open",
            reason=reason,
            detail=detail,
            opened_at=c["opened_at"] or at,
            probes=probes,
            probe_at=at + _secs(probe_in),
            probe_owner=None,
            probe_expires_at=None,
            updated_at=at,
        )
        probe_in = _epoch(c["probe_at"] - at)
        self._circuit_event(
            provider=provider,
            from_state=from_state,
            to_state="open",
            reason=reason,
            detail=detail,
            actor=actor,
            probe_in=probe_in,
            created_at=at,
        )
        return {"present": True, "from_state": from_state, "probes": probes, "probe_in": probe_in}

    @staticmethod
    def _closed_circuit(provider: str, at: datetime) -> dict[str, Any]:
        return {
            "provider": provider,
            "state": "closed",
            "reason": None,
            "detail": None,
            "opened_at": None,
            "probe_at": None,
            "probes": 0,
            "probe_owner": None,
            "probe_expires_at": None,
            "updated_at": at,
        }

    async def circuit_close(
        self, *, provider: str, reason: str, detail: str, actor: str, now: datetime | None = None
    ) -> bool:
        at = await self._op("circuit_close", now)
        c = self.circuit_rows.get(provider)
        if c is None or c["state"] == "closed":
            return False
        from_state = c["state"]
        self._set_circuit(
            c,
            state="closed",
            reason=reason,
            detail=detail,
            opened_at=None,
            probe_at=None,
            probes=0,
            probe_owner=None,
            probe_expires_at=None,
            updated_at=at,
        )
        self._circuit_event(
            provider=provider,
            from_state=from_state,
            to_state="closed",
            reason=reason,
            detail=detail,
            actor=actor,
            created_at=at,
        )
        return True

    async def circuit_probe_take(
        self, *, provider: str, owner: str, hold_seconds: float, lease_seconds: float, now: datetime | None = None
    ) -> bool:
        at = await self._op("circuit_probe_take", now)
        c = self.circuit_rows.get(provider)
        if c is None:
            return False
        due = (c["state"] == "open" and c["probe_at"] <= at) or (
            c["state"] == "half_open" and c["probe_expires_at"] < at
        )
        waiting = any(s["provider"] == provider and self._claimable(s, at, lease_seconds) for s in self.steps.values())
        if not (due and waiting):
            return False
        from_state = c["state"]
        self._set_circuit(
            c,
            state="half_open",
            probe_at=None,
            probe_owner=owner,
            probe_expires_at=at + _secs(hold_seconds),
            updated_at=at,
        )
        self._circuit_event(
            provider=provider,
            from_state=from_state,
            to_state="half_open",
            reason="probe",
            detail=f"probe {c['probes'] + 1} since the circuit opened",
            actor=owner,
            created_at=at,
        )
        return True

    async def circuit_probe_idle(
        self,
        *,
        provider: str,
        owner: str,
        probe_base: float,
        detail: str = "the probe found no step to send",
        now: datetime | None = None,
    ) -> bool:
        at = await self._op("circuit_probe_idle", now)
        c = self.circuit_rows.get(provider)
        if c is None or c["state"] != "half_open" or c["probe_owner"] != owner:
            return False
        self._set_circuit(
            c, state="open", probe_at=at + _secs(probe_base), probe_owner=None, probe_expires_at=None, updated_at=at
        )
        self._circuit_event(
            provider=provider,
            from_state="half_open",
            to_state="open",
            reason=c["reason"],
            detail=detail,
            actor=owner,
            probe_in=float(probe_base),
            created_at=at,
        )
        return True

    async def circuits(self, *, now: datetime | None = None) -> list[dict[str, Any]]:
        at = await self._op("circuits", now)

        def secs(later: datetime | None, earlier: datetime | None) -> float | None:
            return None if later is None or earlier is None else _epoch(later - earlier)

        return [
            {
                **c,
                "probe_in": secs(c["probe_at"], at),
                "probe_hold_left": secs(c["probe_expires_at"], at),
                "open_for": secs(at, c["opened_at"]),
                "openings": sum(1 for e in self.circuit_events if e["provider"] == p and e["to_state"] == "open"),
            }
            for p, c in sorted(self.circuit_rows.items())
        ]

    # -- the reconciler ---------------------------------------------------------------

    async def reconcile_claim(
        self, *, providers: Sequence[str], max_checks: int, hold_seconds: float, now: datetime | None = None
    ) -> UnknownStep | None:
        at = await self._op("reconcile_claim", now)
        due = [
            s
            for s in self.steps.values()
            if s["status"] == "unknown"
            and s["provider"] in providers
            and (s["reconcile_after"] is None or s["reconcile_after"] <= at)
            and s["reconcile_checks"] < max_checks
        ]
        if not due:
            return None
        # ORDER BY reconcile_after NULLS FIRST, unknown_since, id
        s = min(
            due,
            key=lambda s: (s["reconcile_after"] is not None, s["reconcile_after"] or at, s["unknown_since"], s["id"]),
        )
        self._update(s, reconcile_after=at + _secs(hold_seconds))
        return UnknownStep.from_row(s)

    async def reconcile_found(
        self,
        step_id: int,
        *,
        provider_message_id: str | None,
        message: str,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool:
        at = await self._op("reconcile_found", now)
        s = self.steps.get(step_id)
        if s is None or s["status"] != "unknown":
            return False
        self._update(
            s,
            status="accepted",
            reason="reconciled",
            detail=message,
            provider_message_id=_coalesce(provider_message_id, s["provider_message_id"]),
            unknown_since=None,
            closed_at=at,
            reconcile_after=None,
            reconcile_checks=s["reconcile_checks"] + 1,
            updated_at=at,
        )
        self._insert_evidence(
            step_id=step_id,
            run_id=s["run_id"],
            attempt=s["attempts"],
            kind="reconciled",
            actor=actor,
            from_status="unknown",
            to_status="accepted",
            outcome="accepted",
            reason="reconciled",
            provider_message_id=provider_message_id,
            detail=dict(detail),
            created_at=at,
        )
        metrics.observe_closed(s["created_at"], at)
        return True

    async def reconcile_absent(
        self,
        step_id: int,
        *,
        next_check: float,
        detail: Mapping[str, Any],
        actor: str,
        now: datetime | None = None,
    ) -> bool:
        at = await self._op("reconcile_absent", now)
        s = self.steps.get(step_id)
        if s is None or s["status"] != "unknown":
            return False
        self._update(s, reconcile_checks=s["reconcile_checks"] + 1, reconcile_after=at + _secs(next_check))
        self._insert_evidence(
            step_id=step_id,
            run_id=s["run_id"],
            attempt=s["attempts"],
            kind="reconciled",
            actor=actor,
            from_status="unknown",
            reason="reconcile_absent",
            detail=dict(detail),
            created_at=at,
        )
        return True

    # -- delivery events (delivery_record, migration 0017) ------------------------------

    async def delivery_record(
        self, event: DeliveryEvent, *, actor: str, step_providers: Collection[str], now: datetime | None = None
    ) -> DeliveryRecorded:
        at = await self._op("delivery_record", now)
        first = next(
            (d for d in self.deliveries if (d["provider"], d["event_id"]) == (event.provider, event.event_id)), None
        )
        if first is not None:
            return DeliveryRecorded(id=first["id"], step=first["step_id"], duplicate=True, closed=False)
        if event.type not in DELIVERY_TYPES:
            raise InvariantViolated(f"delivery event violates ck_delivery_events_type: {event.type!r}")
        # As delivery_record: the key's digest and the Message-ID's part of the tag (a bare
        # digest names only a step evq 0.2.0 made, and this store has none).
        tag = split_tag(event.key_digest)
        by_key = (
            next(
                (
                    s
                    for s in self.steps.values()
                    if key_digest(s["idempotency_key"]) == tag[0] and message_tag(s["message_id"]) == tag[1]
                ),
                None,
            )
            if tag is not None and tag[1] is not None
            else None
        )
        by_id = next((s for s in self.steps.values() if s["message_id"] == event.message_id), None)
        named = [n for n in (by_key, by_id) if n is not None]
        s = next((n for n in named if n["provider"] in step_providers), None)
        foreign = next((n for n in named if n["provider"] not in step_providers), None)
        stored_detail = dict(event.detail)
        if s is None and foreign is not None:
            stored_detail["not_matched"] = {
                "step": foreign["id"],
                "step_provider": foreign["provider"],
                "why": f"the step was sent by provider {foreign['provider']}, whose messages the "
                f"{event.provider} webhook does not report",
            }
        row = MappingProxyType(
            {
                "id": len(self.deliveries) + 1,
                "provider": event.provider,
                "event_id": event.event_id,
                "type": event.type,
                "occurred_at": event.occurred_at,
                "received_at": at,
                "step_id": s["id"] if s is not None else None,
                "key_digest": event.key_digest,
                "message_id": event.message_id,
                "provider_message_id": event.provider_message_id,
                "recipient": event.recipient,
                "detail": _json(stored_detail),
            }
        )
        self.deliveries.append(row)
        closed = False
        notices = 0
        if s is not None:
            was_accepted_at = s["closed_at"] if s["status"] == "accepted" else None
            message = f"{event.provider} webhook: {event.type}" + (f" for {event.recipient}" if event.recipient else "")
            closed = s["status"] == "unknown" and event.type in PROVES_ACCEPTED
            if closed:
                self._update(
                    s,
                    status="accepted",
                    reason="webhook",
                    detail=message,
                    provider_message_id=_coalesce(event.provider_message_id, s["provider_message_id"]),
                    unknown_since=None,
                    closed_at=at,
                    reconcile_after=None,
                    updated_at=at,
                )
            self._insert_evidence(
                step_id=s["id"],
                run_id=s["run_id"],
                attempt=s["attempts"],
                kind="delivery_event",
                actor=actor,
                from_status="unknown" if closed else None,
                to_status="accepted" if closed else None,
                outcome="accepted" if closed else None,
                reason="webhook" if closed else event.type,
                provider_message_id=event.provider_message_id,
                detail={
                    **dict(event.detail),
                    "delivery_event": row["id"],
                    "provider": event.provider,
                    "event_id": event.event_id,
                    "type": event.type,
                    "occurred_at": event.occurred_at,
                    "recipient": event.recipient,
                    "message": message,
                },
                created_at=at,
            )
            if event.type in TELLS_NOTIFY:  # the helper reads the status itself, as the store's query does
                notices = self._enqueue_delivery_notice(s["id"], row, actor=actor, at=at)
            if closed:
                metrics.observe_closed(s["created_at"], at)
            if event.type == "delivered" and s["status"] == "accepted":
                metrics.observe_delivered(event.provider, at if closed else was_accepted_at, event.occurred_at or at)
        metrics.observe_delivery(event.provider, event.type, matched=s is not None, settled=closed)
        return DeliveryRecorded(id=row["id"], step=row["step_id"], duplicate=False, closed=closed, notices=notices)

    def _unvouched_notify(self, s: Mapping[str, Any]) -> bool:
        """A held send's own notify address that its sender is not known to mail (notice_candidates)."""
        return (
            s["notify"] is not None
            and bool(s["hold"])
            and (sender_of(s["payload"]), s["notify"].lower()) not in self.known_recipients
        )

    def _enqueue_delivery_notice(self, step_id: int, event: Mapping[str, Any], *, actor: str, at: datetime) -> int:
        """delivery_notice_candidates + notice_enqueue: one notice per step and event type."""
        s = self.steps[step_id]
        if s["notice_of"] is not None or s["status"] != "accepted":
            return 0
        key_id = self.decisions[s["decision_id"]]["actor_key_id"]
        key = next((k for k in self.keys.values() if key_id is not None and k["key_id"] == key_id), None)
        notify = s["notify"] or (key or {}).get("notify_email")
        if notify is None or self._unvouched_notify(s):
            return 0
        notify_key = key["name"] if key is not None and s["notify"] is None else None
        try:
            notice = build_delivery_notice({**s, "notify": notify, "notify_key": notify_key}, event, self.notices)
        except InvalidRequest as exc:
            log.error("notice_not_built", step=step_id, error=exc.message, fields=exc.errors)
            return 0
        if notice.idempotency_key in self.pruned_keys or any(
            n["idempotency_key"] == notice.idempotency_key
            or (n["run_id"], n["step_id"]) == (notice.run_id, notice.step_id)
            for n in self.steps.values()
        ):
            return 0
        self._notice_enqueued(notice, step_id, actor=actor, at=at)
        return 1

    async def delivery_events(
        self,
        *,
        step: int | None = None,
        unmatched: bool = False,
        provider: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        await self._op("delivery_events", None)
        matched = [
            d
            for d in reversed(self.deliveries)
            if (step is None or d["step_id"] == step)
            and (not unmatched or d["step_id"] is None)
            and (provider is None or d["provider"] == provider)
            and (before_id is None or d["id"] < before_id)
        ]
        out = []
        for d in matched[offset : offset + limit]:
            s = self.steps.get(d["step_id"]) if d["step_id"] is not None else None
            out.append(
                {
                    **{k: copy.deepcopy(v) for k, v in d.items() if k != "step_id"},
                    "step": d["step_id"],
                    "run_id": s["run_id"] if s else None,
                    "step_id": s["step_id"] if s else None,
                }
            )
        return out, min(len(matched), COUNT_CAP + 1)

    async def delivery_states(self, step_ids: Sequence[int]) -> Mapping[int, Mapping[str, Any]]:
        await self._op("delivery_states", None)
        out: dict[int, Mapping[str, Any]] = {}
        for step_id in set(step_ids):
            mine = [d for d in self.deliveries if d["step_id"] == step_id]
            if mine:
                last = max(mine, key=lambda d: (d["occurred_at"] or d["received_at"], d["id"]))
                out[step_id] = {
                    "state": last["type"],
                    "at": last["occurred_at"] or last["received_at"],
                    "events": len(mine),
                }
        return out

    # -- reading back -----------------------------------------------------------------

    async def get_step(self, step_id: int) -> StepDetail:
        at = await self._op("get_step", None)
        s = self.steps.get(step_id)
        if s is None:
            raise step_not_found(step_id, next((p for p in self.pruned_keys.values() if p["id"] == step_id), None))
        decision = self.decisions.get(s["decision_id"])
        return StepDetail(
            step={**copy.deepcopy(s), "age_seconds": _epoch(at - s["created_at"])},
            decision=copy.deepcopy(decision) if decision is not None else None,
            evidence=[_plain(e) for e in self._evidence_of(step_id)],
        )

    async def get_steps(self, step_ids: Sequence[int]) -> list[StepDetail]:
        if not step_ids:
            return []
        at = await self._op("get_steps", None)
        out = []
        for i in dict.fromkeys(step_ids):
            s = self.steps.get(i)
            if s is None:
                continue
            decision = self.decisions.get(s["decision_id"])
            out.append(
                StepDetail(
                    step={**copy.deepcopy(s), "age_seconds": _epoch(at - s["created_at"])},
                    decision=copy.deepcopy(decision) if decision is not None else None,
                    evidence=[_plain(e) for e in self._evidence_of(i)],
                )
            )
        return out

    async def get_run(self, run_id: str, *, limit: int, offset: int = 0) -> RunDetail:
        await self._op("get_run", None)
        # step_id order by code point: the test cluster's collation (C) orders run_steps so.
        run = sorted((s for s in self.steps.values() if s["run_id"] == run_id), key=lambda s: s["step_id"])
        if not run:
            raise NotFound(f"no steps in run {run_id!r}", hint="`evq steps list` shows the run ids")
        steps = run[offset : offset + limit]
        ids = {s["id"] for s in steps}
        decisions = sorted((self.decisions[s["decision_id"]] for s in steps), key=lambda d: (d["created_at"], d["id"]))
        return RunDetail(
            run_id=run_id,
            steps=[copy.deepcopy(s) for s in steps],
            decisions=[copy.deepcopy(d) for d in decisions],
            evidence=[_plain(e) for e in self.evidence if e["step_id"] in ids],
            total=min(len(run), COUNT_CAP + 1),
        )

    async def last_answers(self, step_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        await self._op("last_answers", None)
        out: dict[int, dict[str, Any]] = {}
        for e in self.evidence:
            if e["step_id"] in step_ids and e["kind"] in (*ANSWERS, "reconciled"):
                keys = ("step_id", "id", "kind", "outcome", "reason", "provider_message_id", "detail", "created_at")
                out[e["step_id"]] = {k: copy.deepcopy(e[k]) for k in keys}
        return out

    async def list_facts(self, step_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        await self._op("list_facts", None)
        keys = ("id", "message_id", "provider_message_id", "held_since", "hold_expires_at", "hold")
        return {i: {k: copy.deepcopy(s[k]) for k in keys} for i, s in self.steps.items() if i in step_ids}

    def _matching(self, where: StepFilter) -> list[dict[str, Any]]:
        """The steps ``where`` matches (the page aside)."""

        def emails(s: Mapping[str, Any], *lists: str) -> list[str]:
            return [r.get("email") for name in lists for r in (s["payload"].get(name) or [])]

        terms = search_terms(where.search) if where.search is not None else None

        def matches(s: Mapping[str, Any]) -> bool:
            domain = (where.recipient_domain or "").lower()
            return (
                (not where.ids or s["id"] in where.ids)
                and (not where.statuses or s["status"] in {str(x) for x in where.statuses})
                and (where.run_id is None or s["run_id"] == where.run_id)
                and (where.provider is None or s["provider"] == where.provider)
                and (where.created_before is None or (s["unknown_since"] or s["created_at"]) < where.created_before)
                and (
                    where.recipient_domain is None
                    or any(
                        (e or "").partition("@")[2].split("@")[0].lower() == domain
                        for e in emails(s, "to", "cc", "bcc")
                    )
                )
            )

        return [s for s in self.steps.values() if matches(s) and _found(s, terms, self.decisions)]

    async def list_steps(self, where: StepFilter, *, now: datetime | None = None) -> tuple[list[StepSummary], int]:
        at = await self._op("list_steps", now)

        def emails(s: Mapping[str, Any], *lists: str) -> list[str]:
            return [r.get("email") for name in lists for r in (s["payload"].get(name) or [])]

        matched = self._matching(where)
        # Unknown and held rows oldest first (by when they began to wait, then by id); everything else newest first.
        queues = ("unknown", "held")
        unknown = sorted(
            (s for s in matched if s["status"] in queues),
            key=lambda s: (s["unknown_since"] or s["held_since"], s["id"]),
        )
        rest = sorted(
            (s for s in matched if s["status"] not in queues), key=lambda s: (s["created_at"], s["id"]), reverse=True
        )
        ordered = unknown + rest
        page = ordered[where.offset :] if where.limit is None else ordered[where.offset : where.offset + where.limit]
        summaries = [
            StepSummary(
                id=s["id"],
                run_id=s["run_id"],
                step_id=s["step_id"],
                status=Status(s["status"]),
                reason=s["reason"],
                provider=s["provider"],
                attempts=s["attempts"],
                recipients=emails(s, "to", "cc", "bcc"),
                subject=s["payload"].get("subject"),
                created_at=s["created_at"],
                updated_at=s["updated_at"],
                unknown_since=s["unknown_since"],
                closed_at=s["closed_at"],
                age_seconds=_epoch(at - (s["unknown_since"] or s["created_at"])),
                maybe_delivered=s["maybe_delivered"],
            )
            for s in page
        ]
        return summaries, min(len(matched), COUNT_CAP + 1)

    async def count_by_status(self, where: StepFilter) -> dict[str, StatusCount]:
        await self._op("count_by_status", None)
        counted = Counter(s["status"] for s in self._matching(replace(where, statuses=())))
        return {str(s): StatusCount.capped(min(counted[str(s)], COUNT_CAP + 1)) for s in Status}

    # -- operators --------------------------------------------------------------------

    async def resolve(
        self,
        step_id: int,
        resolution: Resolution,
        *,
        actor: str,
        default_max_attempts: int,
        now: datetime | None = None,
    ) -> Resolved:
        at = await self._op("resolve", now)
        s = self.steps.get(step_id)
        if s is None:
            raise NotFound(f"no step with id {step_id}", hint="`evq steps list --status unknown` shows the ids")
        to = str(resolution.verdict.to_status)
        cur = copy.deepcopy(s)
        not_before = self._retry_not_before(s)
        requeueable = (
            s["status"] == "rejected"
            and s["reason"] in REQUEUE_REASONS
            and not s["maybe_delivered"]
            and s["content_redacted_at"] is None
        )
        accepted = [
            e["id"]
            for e in self._evidence_of(step_id)
            if e["kind"] in ANSWERS
            and (
                e["outcome"] == "accepted"
                or (
                    isinstance(e["detail"].get("accepted"), int | float)
                    and not isinstance(e["detail"].get("accepted"), bool)
                    and e["detail"]["accepted"] > 0
                )
            )
        ]
        accepted_evidence = max(accepted) if accepted else None
        charged = s["attempts"] - s["uncharged_attempts"]
        closes = not (to == "retryable" and accepted_evidence is not None) and (
            (s["status"] == "unknown" and not (to == "retryable" and not_before is not None and not_before > at))
            or (requeueable and to == "retryable")
        )
        if not closes:
            if (
                resolution.verdict is Verdict.RETRY
                and accepted_evidence is not None
                and (s["status"] == "unknown" or requeueable)
            ):
                raise retry_after_acceptance(step_id, accepted_evidence, s["status"])
            if resolution.verdict is Verdict.RETRY and s["content_redacted_at"] is not None:
                raise retry_after_redaction(step_id, s["content_redacted_at"])
            if s["status"] == "unknown":
                raise retry_too_soon(step_id, not_before, at)
            raise StateConflict(
                f"step {step_id} is {s['status']}, not unknown: only unknown rows can be resolved "
                "(and, with --as retry, rejected rows whose attempts or retry budget ran out on temporary "
                "failures only)",
                hint=f"`evq steps show {step_id}` shows who changed it and when",
                context={"id": step_id, "status": s["status"], "reason": s["reason"]},
            )
        limit = s["max_attempts"] if s["max_attempts"] is not None else default_max_attempts
        self._update(
            s,
            status=to,
            reason="operator",
            detail=resolution.note,
            provider_message_id=_coalesce(resolution.provider_message_id, s["provider_message_id"])
            if to == "accepted"
            else s["provider_message_id"],
            maybe_delivered=False if to == "retryable" else s["maybe_delivered"],
            max_attempts=charged + 1
            if to == "retryable" and not requeueable and charged >= limit
            else s["max_attempts"],
            uncharged_attempts=s["attempts"] if requeueable else s["uncharged_attempts"],
            retry_from=at if requeueable else s["retry_from"],
            next_attempt_at=at if to == "retryable" else s["next_attempt_at"],
            unknown_since=None,
            closed_at=at if to in TERMINAL else None,
            updated_at=at,
        )
        ev = self._insert_evidence(
            step_id=step_id,
            run_id=s["run_id"],
            attempt=s["attempts"],
            kind="operator_resolved",
            actor=actor,
            from_status=cur["status"],
            to_status=to,
            reason=resolution.reason or "operator",
            provider_message_id=resolution.provider_message_id,
            detail={
                "verdict": str(resolution.verdict),
                "note": resolution.note,
                "reference": {
                    "provider_message_id": resolution.provider_message_id,
                    "evidence_url": resolution.evidence_url,
                },
                "previous": {
                    "status": cur["status"],
                    "reason": cur["reason"],
                    "detail": cur["detail"],
                    "unknown_since": cur["unknown_since"],
                    "attempts": cur["attempts"],
                    "max_attempts": cur["max_attempts"],
                    "provider_message_id": cur["provider_message_id"],
                },
                "max_attempts_raised": s["max_attempts"] != cur["max_attempts"],
                "max_attempts": s["max_attempts"],
                "requeued": requeueable,
                "uncharged_attempts": s["uncharged_attempts"],
                "retry_from": at if requeueable else None,
            },
            created_at=at,
        )
        assert ev is not None
        if to == "rejected":
            self._enqueue_notices([step_id], actor=actor, at=at)
        metrics.RESOLUTIONS.labels(**{"as": str(resolution.verdict)}).inc()
        if to in TERMINAL:
            metrics.observe_closed(s["created_at"], at)
        return Resolved(
            step_id=step_id,
            run_id=s["run_id"],
            from_status=Status(cur["status"]),
            to_status=Status(to),
            evidence_id=ev["id"],
            resolved_at=at,
            attempts=s["attempts"],
            max_attempts_before=cur["max_attempts"],
            max_attempts_after=s["max_attempts"],
        )

    # -- the held lifecycle (worker/ports/approvals.py) -------------------------------

    def _held_step(self, step_id: int, hint: str) -> dict[str, Any]:
        s = self.steps.get(step_id)
        if s is None:
            raise NotFound(f"no step with id {step_id}", hint=hint)
        return s

    @staticmethod
    def _current(s: Mapping[str, Any]) -> dict[str, Any]:
        return {"current_status": s["status"], "current_reason": s["reason"]}

    async def approve(
        self,
        step_id: int,
        *,
        actor: str,
        actor_key_id: str,
        note: str,
        edit: Edit | None = None,
        now: datetime | None = None,
    ) -> Decided:
        at = await self._op("approve", now)
        s = self._held_step(step_id, "`evq steps list --status held` shows the held ids")
        if s["status"] != "held":
            raise not_held(step_id, self._current(s), "approved")
        if (self.decisions.get(s["decision_id"]) or {}).get("actor_key_id") == actor_key_id:
            raise self_approval(step_id, actor)
        if edit is not None and s["payload_sha256"] != edit.from_sha256:
            raise StateConflict(
                f"step {step_id}'s request changed since it was read; nothing was approved",
                context={"id": step_id, "status": s["status"], "payload_sha256": s["payload_sha256"]},
            )
        before = copy.deepcopy(s)
        changes: dict[str, Any] = {}
        if edit is not None and edit.payload_sha256 != s["payload_sha256"]:
            changes = {
                "payload": json.loads(edit.payload_json),
                "payload_sha256": edit.payload_sha256,
                "requested_sha256": s["requested_sha256"] or s["payload_sha256"],
            }
        self._update(
            s,
            status="pending",
            reason="approved",
            detail=note,
            held_since=None,
            hold_expires_at=None,
            next_attempt_at=max(s["send_at"] or at, at),
            retry_from=max(s["send_at"] or at, at),
            updated_at=at,
            **changes,
        )
        ev = self._insert_evidence(
            step_id=step_id,
            run_id=s["run_id"],
            attempt=s["attempts"],
            kind="approved",
            actor=actor,
            from_status="held",
            to_status="pending",
            reason="approved",
            detail={
                "note": note,
                "edited": s["payload_sha256"] != before["payload_sha256"],
                "from_sha256": before["payload_sha256"],
                "to_sha256": s["payload_sha256"],
                "fields": list(edit.fields) if edit else [],
                "held_since": before["held_since"],
                "hold_expires_at": before["hold_expires_at"],
                "hold": before["hold"],
            },
            created_at=at,
        )
        assert ev is not None
        sender = s["payload"]["from"]["email"].lower()
        for key in ("to", "cc", "bcc"):
            for r in s["payload"][key]:
                email = r["email"].lower()
                for recipient in (email, "@" + email.rsplit("@", 1)[1]):
                    self.known_recipients.setdefault((sender, recipient), step_id)
        metrics.labelled(metrics.APPROVALS, "approved").inc()
        return Decided(
            step_id=step_id,
            run_id=s["run_id"],
            from_status=Status.HELD,
            to_status=Status.PENDING,
            reason="approved",
            evidence_id=ev["id"],
            decided_at=at,
            payload_sha256=s["payload_sha256"],
            requested_sha256=s["requested_sha256"],
        )

    def _close(self, s: dict[str, Any], *, kind: str, reason: str, actor: str, detail: Any, at: datetime) -> int:
        before = dict(s)
        self._update(
            s,
            status="rejected",
            reason=reason,
            detail=detail if isinstance(detail, str) or detail is None else None,
            held_since=None,
            hold_expires_at=None,
            closed_at=at,
            updated_at=at,
        )
        ev = self._insert_evidence(
            step_id=s["id"],
            run_id=s["run_id"],
            attempt=s["attempts"],
            kind=kind,
            actor=actor,
            from_status=before["status"],
            to_status="rejected",
            reason=reason,
            detail=detail if isinstance(detail, dict) else {"note": detail, "held_since": before["held_since"]},
            created_at=at,
        )
        assert ev is not None
        metrics.observe_closed(s["created_at"], at)
        return int(ev["id"])

    def _decided(self, s: Mapping[str, Any], from_status: str, evidence_id: int, at: datetime) -> Decided:
        return Decided(
            step_id=s["id"],
            run_id=s["run_id"],
            from_status=Status(from_status),
            to_status=Status.REJECTED,
            reason=s["reason"],
            evidence_id=evidence_id,
            decided_at=at,
            payload_sha256=s["payload_sha256"],
            requested_sha256=s["requested_sha256"],
        )

    async def deny(self, step_id: int, *, actor: str, note: str, now: datetime | None = None) -> Decided:
        at = await self._op("deny", now)
        s = self._held_step(step_id, "`evq steps list --status held` shows the held ids")
        if s["status"] != "held":
            raise not_held(step_id, self._current(s), "denied")
        held = {"note": note, "held_since": s["held_since"], "hold_expires_at": s["hold_expires_at"], "hold": s["hold"]}
        evidence_id = self._close(s, kind="denied", reason="denied", actor=actor, detail=held, at=at)
        s["detail"] = note
        self._enqueue_notices([step_id], actor=actor, at=at)
        metrics.labelled(metrics.APPROVALS, "denied").inc()
        return self._decided(s, "held", evidence_id, at)

    async def cancel(self, step_id: int, *, actor: str, note: str | None, now: datetime | None = None) -> Decided:
        at = await self._op("cancel", now)
        s = self._held_step(step_id, "`evq steps list` shows the ids")
        if s["status"] not in ("held", "pending", "retryable") or s["maybe_delivered"]:
            raise not_cancellable(step_id, self._current(s))
        previous = {
            "status": s["status"],
            "reason": s["reason"],
            "attempts": s["attempts"],
            "held_since": s["held_since"],
        }
        from_status = s["status"]
        evidence_id = self._close(
            s, kind="cancelled", reason="cancelled", actor=actor, detail={"note": note, "previous": previous}, at=at
        )
        s["detail"] = note
        self._enqueue_notices([step_id], actor=actor, at=at)
        metrics.labelled(metrics.APPROVALS, "cancelled").inc()
        return self._decided(s, from_status, evidence_id, at)

    async def expire_held(self, *, limit: int, actor: str, now: datetime | None = None) -> int:
        at = await self._op("expire_held", now)
        due = sorted(
            (
                s
                for s in self.steps.values()
                if s["status"] == "held" and s["hold_expires_at"] is not None and s["hold_expires_at"] <= at
            ),
            key=lambda s: (s["hold_expires_at"], s["id"]),
        )[:limit]
        message = "no one approved it before it expired"
        for s in due:
            detail = {"message": message, "held_since": s["held_since"], "hold_expires_at": s["hold_expires_at"]}
            self._close(s, kind="hold_expired", reason="approval_expired", actor=actor, detail=detail, at=at)
            s["detail"] = message
        self._enqueue_notices([s["id"] for s in due], actor=actor, at=at)
        metrics.labelled(metrics.APPROVALS, "expired").inc(len(due))
        return len(due)

    # -- API keys (worker/keys.py) ----------------------------------------------------

    async def create_key(
        self,
        *,
        name: str,
        role: Role,
        key: NewKey,
        created_by: str | None,
        notify_email: str | None = None,
        notify_url: str | None = None,
        approval: KeyApproval | None = None,
        now: datetime | None = None,
    ) -> dict[str, Any]:
        """As PostgresStore.create_key: a bootstrap (``created_by=None``) only while no active
        admin key exists; a name is never reused, even after a revoke."""
        at = await self._op("create_key", now)
        if created_by is None and any(k["role"] == "admin" and k["revoked_at"] is None for k in self.keys.values()):
            raise AuthFailed(
                "an admin key exists now: creating a key needs one",
                hint="set EVQ_API_KEY or pass --api-key (role admin)",
            )
        if name in self.keys or any(k["key_id"] == key.key_id for k in self.keys.values()):
            raise Conflict(
                f"a key named {name!r} exists (names are never reused, even after a revoke)",
                hint="choose another name; `evq keys list` shows the names",
                context={"name": name},
            )
        if not re.fullmatch(r"[0-9a-f]{12}", key.key_id):
            raise InvariantViolated("ck_api_keys_key_id_format")
        self.keys[name] = {
            "name": name,
            "role": str(role),
            "key_id": key.key_id,
            "secret_hash": hash_secret(key.secret, self.pepper),
            "created_at": at,
            "created_by": created_by,
            "revoked_at": None,
            "revoked_by": None,
            "session_generation": 0,
            "notify_email": notify_email,
            "notify_url": notify_url,
            "approval": str(approval or default_approval(role)),
        }
        return {
            k: self.keys[name][k]
            for k in ("name", "role", "key_id", "created_at", "created_by", "notify_email", "notify_url", "approval")
        }

    async def set_key_notify(self, name: str, *, notify_email: str | None) -> dict[str, Any]:
        await self._op("set_key_notify", None)
        if name not in self.keys:
            raise NotFound(f"no key named {name!r}", hint="`evq keys list` shows the names")
        self.keys[name]["notify_email"] = notify_email
        return {k: v for k, v in self.keys[name].items() if k not in ("secret_hash", "session_generation")}

    async def key_events(
        self,
        *,
        since: int,
        limit: int,
        offset: int = 0,
        key_id: str | None = None,
        key_name: str | None = None,
        every: bool = False,
    ) -> tuple[list[dict[str, Any]], int]:
        await self._op("key_events", None)
        if not every and key_id is None:
            key_id = self.keys[key_name]["key_id"] if key_name in self.keys else None
        names = {k["key_id"]: name for name, k in self.keys.items()}
        matched = [
            {**e, "key_name": names.get(e["key_id"])}
            for e in self.feed
            if e["id"] > since and (every or (key_id is not None and e["key_id"] == key_id))
        ]
        return matched[offset : offset + limit], min(len(matched), COUNT_CAP + 1)

    async def key_by_id(self, key_id: str) -> dict[str, Any] | None:
        await self._op("key_by_id", None)
        for k in self.keys.values():
            if k["key_id"] == key_id:
                fields = ("name", "role", "secret_hash", "revoked_at", "session_generation", "approval")
                return {**{f: k[f] for f in fields}, "pepper": self.pepper}
        return None

    async def list_keys(self) -> list[dict[str, Any]]:
        await self._op("list_keys", None)
        hidden = ("secret_hash", "session_generation")
        return [{f: v for f, v in k.items() if f not in hidden} for k in self.keys.values()]

    async def rehash_key(self, key_id: str, *, old: str, new: str) -> None:
        await self._op("rehash_key", None)
        for k in self.keys.values():
            if k["key_id"] == key_id and k["secret_hash"] == old:
                k["secret_hash"] = new

    # -- retention (evq_prune_batch, migration 0009) -----------------------------------

    async def prune_cutoff(self, *, older_than: timedelta) -> datetime:
        at = await self._op("prune_cutoff", None)
        return at - older_than

    def _prunable(self, s: Mapping[str, Any], cutoff: datetime) -> bool:
        def eligible(x: Mapping[str, Any]) -> bool:
            return x["status"] in TERMINAL and x["created_at"] < cutoff and x["closed_at"] < cutoff

        notices = [n for n in self.steps.values() if n["notice_of"] == s["id"]]
        return eligible(s) and all(eligible(n) for n in notices)

    def _prune_roots(self, cutoff: datetime) -> list[dict[str, Any]]:
        """Steps that go, except notices whose original goes too (they ride along with it)."""
        return [
            s
            for s in sorted(self.steps.values(), key=lambda s: s["id"])
            if self._prunable(s, cutoff)
            and not (s["notice_of"] is not None and self._prunable(self.steps[s["notice_of"]], cutoff))
        ]

    def _doomed(self, roots: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        ids = {r["id"] for r in roots}
        return [*roots, *(n for n in self.steps.values() if n["notice_of"] in ids)]

    async def prune_count(self, *, cutoff: datetime) -> PruneCounts:
        await self._op("prune_count", None)
        doomed = self._doomed(self._prune_roots(cutoff))
        ids = {d["id"] for d in doomed}
        return PruneCounts(
            steps=len(doomed),
            evidence=sum(1 for e in self.evidence if e["step_id"] in ids),
            decisions=len({d["decision_id"] for d in doomed}),
        )

    async def prune_batch(self, *, cutoff: datetime, limit: int, actor: str, run: Any, batch: int) -> PruneCounts:
        at = await self._op("prune", None)
        if cutoff > at:
            raise InvariantViolated(f"prune cutoff {cutoff} is later than the clock ({at})")
        if limit < 1:
            raise InvariantViolated("prune batch size must be positive")
        doomed = self._doomed(self._prune_roots(cutoff)[:limit])
        ids = {d["id"] for d in doomed}
        gone = sum(1 for e in self.evidence if e["step_id"] in ids)
        # The one path that removes evidence, as evq_prune_batch is.
        self.evidence = [e for e in self.evidence if e["step_id"] not in ids]
        decisions = {d["decision_id"] for d in doomed}
        for i in ids:
            # evq_prune_batch's upsert into the key ledger: what answers a repeat of the key.
            s = self.steps.pop(i)
            self.pruned_keys[s["idempotency_key"]] = {
                **{k: s[k] for k in ("id", "run_id", "step_id", "idempotency_key", "message_id", "provider")},
                **{k: s[k] for k in ("payload_sha256", "requested_sha256", "status", "reason", "closed_at")},
                "maybe_delivered": s["maybe_delivered"],
                "hold": None,
                "pruned": True,
                "created_at": s["created_at"],
                "pruned_at": at,
            }
        for d in decisions:
            del self.decisions[d]
        counts = PruneCounts(steps=len(ids), evidence=gone, decisions=len(decisions), batches=1)
        if ids:
            self.prune_log.append(
                MappingProxyType(
                    {
                        "id": len(self.prune_log) + 1,
                        "run": run,
                        "batch": batch,
                        "actor": actor,
                        "cutoff": cutoff,
                        "steps": len(ids),
                        "evidence": gone,
                        "decisions": len(decisions),
                        "first_step_id": min(ids),
                        "last_step_id": max(ids),
                        "created_at": at,
                    }
                )
            )
        return counts

    # -- content retention (evq_redact_batch, migration 0013) ---------------------------

    async def redact_content(self, *, keep: timedelta, limit: int, actor: str) -> RedactCounts:
        at = await self._op("redact", None)
        if keep < timedelta(0):
            raise InvariantViolated(f"content retention must be zero or positive, got {keep}")
        if limit < 1:
            raise InvariantViolated("redact batch size must be positive")
        due = sorted(
            (
                s
                for s in self.steps.values()
                if s["status"] in TERMINAL and s["content_redacted_at"] is None and s["closed_at"] <= at - keep
            ),
            key=lambda s: (s["closed_at"], s["id"]),
        )[:limit]
        for s in due:
            self._redact(s, at, keep=keep, actor=actor)
        return RedactCounts(redacted=len(due), batches=1)

    def _redact(self, s: dict[str, Any], at: datetime, *, keep: timedelta, actor: str) -> None:
        """As the owner's function writes it: the guard's exemption, the constraints still checked."""
        parts = {
            name: None
            if s["payload"].get(name) is None
            else {
                "bytes": len(s["payload"][name].encode()),
                "sha256": hashlib.sha256(s["payload"][name].encode()).hexdigest(),
            }
            for name in ("text", "html")
        }
        payload = {
            **s["payload"],
            "text": None,
            "html": None,
            "content_redacted": {"at": at.isoformat(), "parts": parts},
        }
        new = {**s, "payload": payload, "content_redacted_at": at, "updated_at": at}
        _check_step(new)
        s.update(new)
        self._insert_evidence(
            step_id=s["id"],
            run_id=s["run_id"],
            kind="content_redacted",
            actor=actor,
            reason="retention",
            detail={
                "message": "message body removed by retention; sizes and SHA-256 kept",
                "parts": parts,
                "payload_sha256": s["payload_sha256"],
                "keep_seconds": keep.total_seconds(),
            },
            created_at=at,
        )

    # -- refused enqueues (enqueue_refusals, migration 0014) ------------------------------

    async def record_refusal(self, refusal: Refusal, *, now: datetime | None = None) -> int:
        at = await self._op("record_refusal", now)
        if refusal.interface not in REFUSAL_INTERFACES or len(refusal.request_sha256) != 64:
            raise InvariantViolated(f"refusal violates a ck_enqueue_refusals constraint: {refusal}")
        row = {"id": len(self.refusals) + 1, "created_at": at, **_json(asdict(refusal))}
        self.refusals.append(row)
        for field in refusal.reasons:
            key = (refusal.interface, field)
            self.refusal_counts[key] = self.refusal_counts.get(key, 0) + 1
        return row["id"]

    async def list_refusals(
        self,
        *,
        key_name: str | None = None,
        interface: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        await self._op("list_refusals", None)
        rows = [
            r
            for r in reversed(self.refusals)
            if (key_name is None or r["key_name"] == key_name)
            and (interface is None or r["interface"] == interface)
            and (before_id is None or r["id"] <= before_id)
        ]
        return [_plain(r) for r in rows[offset : offset + limit]], min(len(rows), COUNT_CAP + 1)

    async def prune_partition(
        self, *, cutoff: datetime, actor: str, run: Any, batch: int, after: int | None
    ) -> PartitionPrune | None:
        # No partitions here: every step goes by prune_batch, as in a PostgreSQL database whose
        # partitions all hold a step that may not go yet.
        await self._op("prune_partition", None)
        return None

    async def evidence_partitions_ahead(self, steps: int) -> int:
        await self._op("evidence_partitions_ahead", None)
        return 0

    async def prune_refusals(self, *, cutoff: datetime, limit: int, dry_run: bool = False) -> int:
        await self._op("prune_refusals_count" if dry_run else "prune_refusals", None)
        old = [r for r in self.refusals if r["created_at"] < cutoff]
        if dry_run:
            return len(old)
        doomed = {r["id"] for r in sorted(old, key=lambda r: r["created_at"])[:limit]}
        self.refusals = [r for r in self.refusals if r["id"] not in doomed]
        return len(doomed)

    async def prune_budgets(
        self, *, cutoff: datetime, limit: int, after: BudgetKey | None, dry_run: bool = False
    ) -> BudgetPrune:
        await self._op("prune_budgets", None)
        # In code point order; PostgreSQL's follows the database's collation (the tests' is C):
        # a pass visits and deletes the same counters, its batches may cut them elsewhere.
        keys = sorted(k for k in self.send_budgets if after is None or k > after)[:limit]
        runs = {s["run_id"] for s in self.steps.values()}
        span = {str(b): timedelta(seconds=s) for b, s in WINDOW_SECONDS.items()}

        def closed(budget: str, scope: str, window: datetime) -> bool:
            if budget in span:
                return window + span[budget] <= cutoff
            charged = self.budgets_charged.get((budget, scope, window))
            return budget == "run_recipients" and charged is not None and charged < cutoff and scope not in runs

        doomed = [k for k in keys if closed(*k)]
        if not dry_run:
            for k in doomed:
                del self.send_budgets[k], self.budgets_charged[k]
        return BudgetPrune(budgets=len(doomed), last=keys[-1] if keys else None)

    def _retry_not_before(self, s: Mapping[str, Any]) -> datetime | None:
        """step_resolve's retry_not_before: the rescued attempt's lease end plus the adapter's
        whole deadline (DEADLINE_SHARE of the lease, counted from the attempt's start)."""
        if s["reason"] != "lease_expired":
            return None
        evidence = self._evidence_of(s["id"])
        rescues = [e for e in evidence if e["kind"] == "lease_expired" and e["attempt"] == s["attempts"]]
        if not rescues:
            return None
        le = rescues[-1]
        raw = le["detail"].get("lease_expired_at")
        starts = [
            e["created_at"]
            for e in evidence
            if e["kind"] == "attempt_started" and e["attempt"] == le["attempt"] and e["id"] < le["id"]
        ]
        if raw is None or not starts:
            return None
        expired = datetime.fromisoformat(raw)
        return expired + (expired - max(starts)) * DEADLINE_SHARE

    # -- the overview's pictures (worker/ports/charts.py; queries.sql queue_sample, chart_*) --

    async def sample_queue(self, sampled_by: str, *, keep_seconds: float, now: datetime | None = None) -> bool:
        at = await self._op("queue_sample", now)
        minute = at.replace(second=0, microsecond=0)
        samples = self.queue_samples
        for old in [m for m in samples if m < minute - timedelta(seconds=keep_seconds)]:
            del samples[old]
        if minute in samples:
            return False
        rows = list(self.steps.values())
        due = [r for r in rows if r["status"] in ("pending", "retryable") and r["next_attempt_at"] <= at]
        unknown = [r for r in rows if r["status"] == "unknown"]
        samples[minute] = {
            "at": minute,
            "pending": sum(r["status"] == "pending" for r in rows),
            "claimable": len(due),
            "lag_seconds": max(((at - r["next_attempt_at"]).total_seconds() for r in due), default=0.0),
            "in_flight": sum(r["status"] == "in_flight" for r in rows),
            "retryable": sum(r["status"] == "retryable" for r in rows),
            "unknown": len(unknown),
            "unknown_oldest_seconds": max(((at - r["unknown_since"]).total_seconds() for r in unknown), default=None),
            "held": sum(r["status"] == "held" for r in rows),
            "sampled_by": sampled_by,
        }
        return True

    async def roll_up_sends(self, *, keep_seconds: float, now: datetime | None = None) -> int:
        # The charts here count evidence directly (the same totals); only the watermark's
        # minutes are kept, so both stores answer how many minutes a call rolled up.
        at = await self._op("send_rollup", now)
        minute = at.replace(second=0, microsecond=0)
        hi = (at - timedelta(minutes=2)).replace(second=0, microsecond=0)
        lo = self.rollup_upto if self.rollup_upto is not None else minute - timedelta(hours=24)
        if hi <= lo:
            return 0
        self.rollup_upto = hi
        return int((hi - lo).total_seconds() // 60)

    def _window(self, hours: int, at: datetime) -> list[Mapping[str, Any]]:
        since, until = windows.bounds(hours, at)
        return [e for e in self.evidence if since <= e["created_at"] < until]

    @staticmethod
    def _send_outcome(e: Mapping[str, Any]) -> str | None:
        if e["kind"] == "provider_response":
            return str(e["outcome"])
        if e["kind"] == "lease_expired" and e["to_status"] == "unknown":
            return "no_answer"
        return None

    async def chart_sends(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        at = await self._op("chart_sends", now)
        width = windows.bucket_seconds(hours)
        counts: dict[tuple[datetime, str], int] = {}
        for e in self._window(hours, at):
            outcome = self._send_outcome(e)
            if outcome is not None:
                key = (windows.bucket_start(e["created_at"], width), outcome)
                counts[key] = counts.get(key, 0) + 1
        return [{"at": b, "outcome": o, "n": n} for (b, o), n in sorted(counts.items())]

    async def chart_unknown_ages(self, *, now: datetime | None = None) -> list[int]:
        at = await self._op("chart_unknown_ages", now)
        counts = [0] * (len(windows.UNKNOWN_AGES) + 1)
        for r in self.steps.values():
            if r["status"] == "unknown":
                counts[bisect.bisect_right(windows.UNKNOWN_AGES, (at - r["unknown_since"]).total_seconds())] += 1
        return counts

    async def chart_queue_samples(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        at = await self._op("chart_queue_samples", now)
        since, until = windows.bounds(hours, at)
        samples = self.queue_samples
        keys = ("at", "pending", "claimable", "lag_seconds", "in_flight", "retryable", "unknown")
        keys += ("unknown_oldest_seconds", "held")
        return [{k: samples[m][k] for k in keys} for m in sorted(samples) if since <= m < until]

    async def chart_providers(self, hours: int, *, now: datetime | None = None) -> list[dict[str, Any]]:
        at = await self._op("chart_providers", now)
        rows: dict[str, dict[str, Any]] = {}
        latencies: dict[str, list[float]] = {}
        since, until = windows.bounds(hours, at)
        latest = max(since, until - timedelta(hours=1))
        for e in self._window(hours, at):
            outcome = self._send_outcome(e)
            if e["kind"] != "attempt_started" and outcome is None:
                continue
            provider = self.steps[e["step_id"]]["provider"]
            row = rows.setdefault(
                provider, {"provider": provider, "attempts": 0, **dict.fromkeys(windows.SEND_OUTCOMES, 0)}
            )
            if e["kind"] == "attempt_started":
                row["attempts"] += 1
                continue
            row[outcome] += 1
            # Latency over the window's last hour only (queries.sql's chart_providers).
            if e["kind"] == "provider_response" and e["latency_ms"] is not None and e["created_at"] >= latest:
                latencies.setdefault(provider, []).append(float(e["latency_ms"]))
        for provider, row in rows.items():
            row["p50_ms"] = _percentile(latencies.get(provider, []), 0.5)
            row["p95_ms"] = _percentile(latencies.get(provider, []), 0.95)
        return [rows[p] for p in sorted(rows)]


def _percentile(values: list[float], fraction: float) -> float | None:
    """percentile_cont: linear between the two nearest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = fraction * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(row))


def _found(s: Mapping[str, Any], terms: SearchTerms | None, decisions: Mapping[int, Mapping[str, Any]]) -> bool:
    """The search box's match (adapters/postgres/queries.sql, step_list's `hits`)."""
    if terms is None:
        return True
    decision = decisions.get(s["decision_id"]) or {}
    return (
        s["id"] == terms.step_id
        or (terms.recipient is not None and terms.recipient in _recipient_keys(s["payload"]))
        or s["message_id"] == terms.message_id
        or terms.text in (s["provider_message_id"], s["idempotency_key"], s["run_id"])
        or (decision.get("actor") is not None and decision.get("actor") == terms.text)
    )


def _recipient_keys(payload: Mapping[str, Any]) -> set[str]:
    """migrations/versions/0019's evq_recipient_keys: each address lower-cased, and its @domain."""
    keys = set()
    for name in ("to", "cc", "bcc"):
        for r in payload.get(name) or []:
            e = (r.get("email") or "").lower() if isinstance(r, Mapping) else ""
            if e:
                keys |= {e, "@" + e.split("@")[1] if "@" in e else "@"}
    return keys
