"""Why an operator's ``retry`` of a rescued row waits (invariant 9).

The rescuer makes a row ``unknown`` when its lease runs out, but the worker that held
it may only be paused or slow: until that attempt's lease plus the adapter's whole
deadline has passed, it could still be talking to the provider (a process woken from
SIGSTOP acts before it notices). A retry in that window could send the message a
second time; checking the provider first would not help, as the first send may not
have happened yet. The database computes the instant (step_resolve); this is the
refusal that tells the operator when to come back. A retry of a step whose provider
said it took the message (for some recipients) is refused for good.
"""

from __future__ import annotations

from datetime import datetime

from evq.worker.errors import StateConflict


def retry_too_soon(step_id: int, not_before: datetime | None, now: datetime) -> StateConflict:
    when = not_before.isoformat() if not_before is not None else None
    wait = max(0.0, (not_before - now).total_seconds()) if not_before is not None else 0.0
    return StateConflict(
        f"step {step_id} was rescued while its attempt may still be in progress: "
        f"a retry is possible from {when} (in {wait:.0f}s)",
        hint=f"wait until {when}, or close it as accepted/rejected if you know what the provider did",
        context={
            "id": step_id,
            "status": "unknown",
            "reason": "lease_expired",
            "retry_possible_at": when,
            "retry_in_seconds": round(wait, 1),
        },
    )


def retry_after_acceptance(step_id: int, evidence_id: int, status: str) -> StateConflict:
    """A retry of a step the provider said it took, for some recipients at least: the
    same bytes would reach them a second time. An operator's check of a mailbox cannot
    outweigh the provider's own answer, so the way out is to close it, not resend it."""
    return StateConflict(
        f"step {step_id}: the provider accepted this message (evidence {evidence_id}), for some recipients "
        "at least; a retry would send it to them again",
        hint=f"`evq steps show {step_id}` shows the answer; close it as accepted (or rejected) instead",
        context={"id": step_id, "status": status, "accepted_evidence": evidence_id},
    )


def retry_after_redaction(step_id: int, redacted_at: datetime) -> StateConflict:
    """A dead-letter requeue of a step whose body content retention removed: what would go
    out is no longer what the agent asked for, so it is refused (and the database's
    trigger evq_content_guard refuses it too)."""
    return StateConflict(
        f"step {step_id}: its message content was removed by retention at {redacted_at.isoformat()} "
        "(EVQ_KEEP_CONTENT); it cannot be sent again",
        hint="enqueue the message anew, as a new step, if it should still go out",
        context={"id": step_id, "status": "rejected", "content_redacted_at": redacted_at.isoformat()},
    )
