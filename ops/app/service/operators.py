"""What operators do to unknown (and dead-lettered) steps: steps resolve, one by id or a
:class:`Selection` of every row a filter matches."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from evq.ops.app.longwork import Tally, each
from evq.ops.app.service.common import Caller, Reply
from evq.ops.app.service.steps import step_filter, summary
from evq.worker.errors import (
    InvalidRequest,
    NotFound,
    StateConflict,
)
from evq.worker.keys import Permission
from evq.worker.ports import AppStore, StepFilter
from evq.worker.records import StepSummary
from evq.worker.resolution import Resolution, Verdict, requeueable
from evq.worker.states import Status

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
