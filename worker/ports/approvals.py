"""The held lifecycle (issue 17): a person approves or denies a held send, a caller cancels
one not yet sent, and held sends past their expiry are closed. Each is one guarded
statement with its evidence (adapters/postgres/queries.sql ``step_approve`` ...)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from evq.worker.states import Status


@dataclass(frozen=True, slots=True)
class Edit:
    """An approver's correction: the new payload (validated as at enqueue) and its hash, the
    hash it replaces (the statement refuses if the row changed since it was read), and the
    fields that changed."""

    payload: Mapping[str, Any]
    payload_json: str
    payload_sha256: str
    from_sha256: str
    fields: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Decided:
    """A held-lifecycle transition that took effect."""

    step_id: int
    run_id: str
    from_status: Status
    to_status: Status
    reason: str
    evidence_id: int
    decided_at: datetime
    payload_sha256: str
    requested_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.step_id,
            "run_id": self.run_id,
            "from_status": str(self.from_status),
            "to_status": str(self.to_status),
            "reason": self.reason,
            "evidence_id": self.evidence_id,
            "decided_at": self.decided_at,
            "payload_sha256": self.payload_sha256,
            "requested_sha256": self.requested_sha256,
        }


class ApprovalStore(Protocol):
    """What approve, deny and cancel (ops/app/approvals.py) ask of the store."""

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
        """held -> pending (reason approved), the same key and Message-ID; with ``edit``, the
        corrected payload (``requested_sha256`` keeps the agent's hash). The recipients become
        known to the sender. ``actor_key_id``: the approving key's id; the key that enqueued the
        step never approves it (Forbidden), whichever interface asked. NotFound; StateConflict
        when the step is not held (or changed)."""
        ...

    async def deny(self, step_id: int, *, actor: str, note: str, now: datetime | None = None) -> Decided:
        """held -> rejected (reason denied), ``notify`` told if its sender may mail it. NotFound; StateConflict."""
        ...

    async def cancel(self, step_id: int, *, actor: str, note: str | None, now: datetime | None = None) -> Decided:
        """pending, retryable (never possibly delivered) or held -> rejected (reason cancelled).
        NotFound; StateConflict (in flight: a worker is sending it; or it may have been delivered)."""
        ...


class ExpireStore(Protocol):
    """The worker's pass over held sends past ``hold_expires_at`` (worker/approval_actions.py)."""

    async def expire_held(self, *, limit: int, actor: str, now: datetime | None = None) -> int:
        """held -> rejected (reason approval_expired) for at most ``limit`` steps, with
        ``hold_expired`` evidence and their notices; how many."""
        ...
