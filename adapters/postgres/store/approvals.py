"""The held lifecycle (worker/ports/approvals.py): approve, deny, cancel, and the expiry pass."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from evq.adapters.postgres.notices import notice_op
from evq.adapters.postgres.op_runner import run_async
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase, fetch_all
from evq.worker import metrics
from evq.worker.approval_actions import not_cancellable, not_held, self_approval
from evq.worker.errors import NotFound, StateConflict
from evq.worker.logs import get_logger
from evq.worker.ports.approvals import Decided, Edit
from evq.worker.states import Status

log = get_logger("evq.store")

_NOT_FOUND_HINT = "`evq steps list --status held` shows the held ids"


def _decided(row: Mapping[str, Any], to: Status, reason: str, sha: str) -> Decided:
    return Decided(
        step_id=row["id"],
        run_id=row["run_id"],
        from_status=Status(row["current_status"]),
        to_status=to,
        reason=reason,
        evidence_id=row["evidence_id"],
        decided_at=row["decided_at"],
        payload_sha256=sha,
        requested_sha256=row.get("requested_sha256"),
    )


class PostgresApprovals(PostgresBase):
    """Approve, deny, cancel; the expiry pass."""

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
        params = {
            "now": now,
            "id": step_id,
            "actor": actor,
            "actor_key_id": actor_key_id,
            "note": note,
            "payload": edit.payload_json if edit else None,
            "payload_sha256": edit.payload_sha256 if edit else None,
            "from_sha256": edit.from_sha256 if edit else None,
            "fields": json.dumps(list(edit.fields) if edit else []),
        }
        async with self._op("approve") as conn, conn.transaction():
            rows = await fetch_all(conn, Q["step_approve"], params)
        if not rows:
            raise NotFound(f"no step with id {step_id}", hint=_NOT_FOUND_HINT)
        row = rows[0]
        if not row["changed"]:
            if row["current_status"] == str(Status.HELD) and row["asked"]:
                raise self_approval(step_id, actor)
            if row["current_status"] == str(Status.HELD):
                raise StateConflict(
                    f"step {step_id}'s request changed since it was read; nothing was approved",
                    hint=f"`evq steps show {step_id}` shows it as it is now",
                    context={"id": step_id, "status": row["current_status"], "payload_sha256": row["current_sha256"]},
                )
            raise not_held(step_id, row, "approved")
        metrics.labelled(metrics.APPROVALS, "approved").inc()
        return _decided(row, Status.PENDING, "approved", row["payload_sha256"])

    async def deny(self, step_id: int, *, actor: str, note: str, now: datetime | None = None) -> Decided:
        async with self._op("deny") as conn, conn.transaction():
            rows = await fetch_all(conn, Q["step_deny"], {"now": now, "id": step_id, "actor": actor, "note": note})
            if rows and rows[0]["changed"]:
                # The sender learns its email will not go out, in the transaction of the denial.
                await run_async(conn, notice_op([step_id], self.notices, actor=actor, now=now))
        if not rows:
            raise NotFound(f"no step with id {step_id}", hint=_NOT_FOUND_HINT)
        row = rows[0]
        if not row["changed"]:
            raise not_held(step_id, row, "denied")
        metrics.labelled(metrics.APPROVALS, "denied").inc()
        metrics.observe_closed(row["created_at"], row["decided_at"])
        return _decided(row, Status.REJECTED, "denied", row["payload_sha256"])

    async def cancel(self, step_id: int, *, actor: str, note: str | None, now: datetime | None = None) -> Decided:
        params = {"now": now, "id": step_id, "actor": actor, "note": note}
        # A step put back in the queue while the cancel waited for its row (approved, requeued)
        # has a queue row the statement could not lock: it changed nothing, and runs again in a
        # new transaction (the step's row lock given up, so the queue row is locked first, as
        # every writer locks them). A second race needs a second requeue, which only a held,
        # unknown or rejected step gets: one that is pending now is not requeued again.
        for _ in range(3):
            async with self._op("cancel") as conn, conn.transaction():
                rows = await fetch_all(conn, Q["step_cancel"], params)
                if rows and rows[0]["changed"]:
                    # A cancelled send is a failed one: its sender is told, as of any rejection
                    # (docs/design.md, "Failure notices"), in the transaction of the cancel.
                    await run_async(conn, notice_op([step_id], self.notices, actor=actor, now=now))
            if not (rows and rows[0]["requeued_meanwhile"]):
                break
            log.info("cancel_requeued_meanwhile", step=step_id)
            if self._pinned():
                # Inside a caller's transaction the step's row lock outlives this try, and a
                # second try would wait for the queue row while holding it: the caller retries.
                raise StateConflict(
                    f"step {step_id} was put back in the queue while the cancel waited for it",
                    hint="cancel it again: it is cancelled unless a worker has begun sending it",
                    context={"id": step_id, "status": rows[0]["current_status"]},
                )
        if not rows:
            raise NotFound(f"no step with id {step_id}", hint="`evq steps list` shows the ids")
        row = rows[0]
        if not row["changed"]:
            log.info("cancel_conflict", step=step_id, status=row["current_status"])
            raise not_cancellable(step_id, row)
        metrics.labelled(metrics.APPROVALS, "cancelled").inc()
        metrics.observe_closed(row["created_at"], row["decided_at"])
        return _decided(row, Status.REJECTED, "cancelled", row["payload_sha256"])

    async def expire_held(self, *, limit: int, actor: str, now: datetime | None = None) -> int:
        async with self._op("expire_held") as conn, conn.transaction():
            rows = await fetch_all(conn, Q["steps_expire_held"], {"now": now, "limit": limit, "actor": actor})
            if rows:
                await run_async(conn, notice_op([r["id"] for r in rows], self.notices, actor=actor, now=now))
        for r in rows:
            metrics.observe_closed(r["created_at"], r["at"])
        metrics.labelled(metrics.APPROVALS, "expired").inc(len(rows))
        return len(rows)
