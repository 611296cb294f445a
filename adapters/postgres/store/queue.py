"""The worker's transitions: claim, record (with the notices a rejection owes), release, rescue."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from evq.adapters.postgres.notices import notice_op
from evq.adapters.postgres.op_runner import run_async
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase
from evq.worker.records import (
    ClaimedStep,
    RecordResult,
    RescueCounts,
    Transition,
    build_claimed_step,
    build_record_result,
)
from evq.worker.states import Status


class PostgresQueue(PostgresBase):
    """Claims, outcomes, releases and rescues (worker/ports: the queue's roles)."""

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
        """Claim up to ``limit`` rows. Their lease tokens derive from ``claim_id`` (a fresh
        one when not given), so a caller that never got the answer can name them later
        (:meth:`release_orphans`)."""
        params = {
            "now": now,
            "claim_id": claim_id or new_claim_id(),
            "probe": probe,
            "owner": owner,
            "providers": list(providers),
            "limit": limit,
            "lease_seconds": lease_seconds,
            "dedupe_windows": json.dumps(dict(dedupe_windows)),
        }
        # The hot path: rows as tuples in ClaimedStep's own field order (step_claim's select
        # list), one builder call each (records.positional_builder), instead of a dict per row
        # read back by key. The column names are checked against the fields, so a reordered
        # select list fails loudly.
        async with self._op("claim") as conn, conn.cursor() as cur:
            await cur.execute(Q["step_claim"], params)
            # Checked at the first answer only: the statement is one text for the process's life,
            # and reading the description builds a column object per column at every claim.
            if not _claim_columns_checked:
                _check_claim_columns(cur)
            return [build_claimed_step(*row) for row in await cur.fetchall()]

    async def record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]:
        if not self.notices.due([t.to_status for t in transitions], [t.reason for t in transitions]):
            return await self._record(transitions, actor=actor, now=now)
        # The rare batch that rejects a step: its notice is enqueued in the same transaction.
        async with self.transaction("record_with_notices"):
            results = await self._record(transitions, actor=actor, now=now)
            await self.enqueue_notices([r.step_id for r in results if r.applied or r.settled], actor=actor, now=now)
        return results

    async def _record(
        self, transitions: Sequence[Transition], *, actor: str, now: datetime | None = None
    ) -> list[RecordResult]:
        if not transitions:
            return []
        rows = await self._fetch(
            "record", Q["step_record"], {"transitions": _transitions_json(transitions), "actor": actor, "now": now}
        )
        not_applied = set(rows[0]["fenced"])
        if not not_applied:  # the common batch: every transition took effect
            return [build_record_result(t.step_id, True, False, False) for t in transitions]
        results = [
            build_record_result(t.step_id, True, False, False) for t in transitions if t.step_id not in not_applied
        ]
        fenced = [t for t in transitions if t.step_id in not_applied]
        if fenced:
            late = await self._fetch(
                "record_late",
                Q["step_record_late"],
                {"transitions": _transitions_json(fenced), "actor": actor, "now": now},
            )
            by_id = {r["id"]: r for r in late}
            for t in fenced:
                row = by_id.get(t.step_id, {"recorded": False, "settled": False})
                results.append(
                    RecordResult(
                        step_id=t.step_id, applied=False, settled=row["settled"], duplicate=not row["recorded"]
                    )
                )
        return results

    async def release(self, steps: Sequence[ClaimedStep], *, actor: str, now: datetime | None = None) -> int:
        return await self._release([(s.id, s.lease_token, s.attempt) for s in steps], actor=actor, now=now)

    async def release_orphans(
        self, *, owner: str, held: Sequence[Any], claims: Sequence[str], now: datetime | None = None
    ) -> int:
        """Release rows of ``claims`` (claims whose answer was lost) that this worker never
        received: only tokens derived from those claim ids, never one in ``held``."""
        if not claims:
            return 0
        rows = await self._fetch(
            "orphan_claims",
            Q["step_orphan_claims"],
            {"owner": owner, "held": [str(t) for t in held], "claims": list(claims)},
        )
        return await self._release([(r["id"], r["lease_token"], r["attempts"]) for r in rows], actor=owner, now=now)

    async def _release(self, held: Sequence[tuple[int, Any, int]], *, actor: str, now: datetime | None) -> int:
        if not held:
            return 0
        ids, tokens, attempts = (list(column) for column in zip(*held, strict=True))
        rows = await self._fetch(
            "release",
            Q["step_release"],
            {"now": now, "actor": actor, "ids": ids, "lease_tokens": tokens, "attempts": attempts},
        )
        return len(rows)

    async def enqueue_notices(
        self, step_ids: Sequence[int], *, actor: str, now: datetime | None = None
    ) -> list[tuple[int, int]]:
        """Failure notices for those of ``step_ids`` that owe one: [(notice id, step id)].

        Call it inside :meth:`transaction`, with the statement that closed the steps,
        so transition and notice commit together. Repeating it is a no-op.
        """
        async with self._op("notices") as conn:
            return await run_async(conn, notice_op(step_ids, self.notices, actor=actor, now=now))

    async def rescue(
        self, *, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None = None
    ) -> RescueCounts:
        if Status.UNKNOWN not in self.notices.statuses:
            counts, _ = await self._rescue(limit, lease_seconds, default_max_attempts, actor, now)
            return counts
        async with self.transaction("rescue_with_notices"):
            counts, unknown = await self._rescue(limit, lease_seconds, default_max_attempts, actor, now)
            await self.enqueue_notices(unknown, actor=actor, now=now)
        return counts

    async def _rescue(
        self, limit: int, lease_seconds: float, default_max_attempts: int, actor: str, now: datetime | None
    ) -> tuple[RescueCounts, list[int]]:
        rows = await self._fetch(
            "rescue",
            Q["step_rescue"],
            {
                "now": now,
                "limit": limit,
                "lease_seconds": lease_seconds,
                "default_max_attempts": default_max_attempts,
                "actor": actor,
            },
        )
        closed = await self._fetch(
            "close_windows",
            Q["step_close_windows"],
            {"now": now, "limit": limit, "lease_seconds": lease_seconds, "actor": actor},
        )
        unknown = [r["id"] for r in rows if r["status"] == "unknown"]
        counts = RescueCounts(unknown=len(unknown), retryable=len(rows) - len(unknown), window_closed=len(closed))
        return counts, unknown + [r["id"] for r in closed]

    async def claimable_exists(
        self, *, providers: Sequence[str], lease_seconds: float, now: datetime | None = None
    ) -> bool:
        rows = await self._fetch(
            "claimable_exists",
            Q["step_claimable_exists"],
            {"providers": list(providers), "lease_seconds": lease_seconds, "now": now},
        )
        return bool(rows[0]["claimable"])

    async def waiting(self, *, providers: Sequence[str], now: datetime | None = None) -> list[dict[str, Any]]:
        return await self._fetch("waiting", Q["steps_waiting"], {"providers": list(providers), "now": now})


# step_claim's select list, by name: ClaimedStep's fields in order (``attempts`` is its ``attempt``).
_CLAIM_COLUMNS = (
    "id",
    "run_id",
    "step_id",
    "idempotency_key",
    "message_id",
    "provider",
    "payload",
    "attempts",
    "max_attempts",
    "lease_token",
    "lease_seconds",
    "dedupe_remaining",
    "maybe_delivered",
    "created_at",
    "uncharged_attempts",
    "budget_age",
)


_claim_columns_checked = False


def _check_claim_columns(cur: Any) -> None:
    global _claim_columns_checked
    if cur.description is None or tuple(c.name for c in cur.description) != _CLAIM_COLUMNS:
        raise RuntimeError("step_claim's columns are not ClaimedStep's fields in order")
    _claim_columns_checked = True


def new_claim_id() -> str:
    """Random and unguessable, so two claims never derive the same lease token."""
    return uuid.uuid4().hex


# One encoder for every batch of outcomes (json.dumps with options builds one per call). Lease
# tokens (UUIDs) go through ``default=str``; statuses and reasons are str enums, written as the
# text they are: no str() call per field in Python.
_ENCODE = json.JSONEncoder(ensure_ascii=False, default=str).encode


def _transitions_json(transitions: Sequence[Transition]) -> str:
    return _ENCODE(
        [
            {
                "id": t.step_id,
                "lease_token": t.lease_token,
                "attempt": t.attempt,
                "to_status": t.to_status,
                "reason": t.reason,
                "outcome": t.outcome,
                "provider_message_id": t.provider_message_id,
                "retry_delay": t.retry_delay,
                "maybe_delivered": t.maybe_delivered,
                "latency_ms": t.latency_ms,
                "detail": t.detail,
                "message": _message(t),
                "charged": t.charged,
            }
            for t in transitions
        ]
    )


def _message(t: Transition) -> str | None:
    message = t.detail.get("message")
    return str(message)[:1000] if message is not None else None
