"""What the application layer (ops/app/service/) asks of the store: enqueue, read back, resolve."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from evq.worker.approval_policy import ApprovalPolicy
from evq.worker.records import EnqueueResult, Resolved, RunDetail, StepDetail, StepSummary
from evq.worker.request import ValidRequest
from evq.worker.resolution import Resolution
from evq.worker.states import Status

# How far a list's total and a state's count are counted (docs/design.md, "Search"): at a
# million rows a full count costs more than the page itself. A store counts at most
# COUNT_CAP + 1 rows; a figure above COUNT_CAP means "more than COUNT_CAP".
COUNT_CAP = 10_000
# How many of the newest steps the other filters leave a subject filter reads at most
# (docs/design.md, "Search by subject"): no index answers a substring of the subject, and
# email_steps (the hot table) gets none for it; 100,000 steps read in about 0.3 s at a million
# (docs/benchmarks.md). An operator narrows an older search by run, provider, age or state.
SUBJECT_SCAN_CAP = 100_000


@dataclass(frozen=True, slots=True)
class StatusCount:
    """One state's count of a filter's steps: ``n`` exact when ``exact``, else "n or more"
    (``n`` is then COUNT_CAP)."""

    n: int
    exact: bool

    @classmethod
    def capped(cls, counted: int) -> StatusCount:
        """From a count of at most COUNT_CAP + 1 rows."""
        return cls(min(counted, COUNT_CAP), counted <= COUNT_CAP)


@dataclass(frozen=True, slots=True)
class StepFilter:
    ids: tuple[int, ...] = ()
    statuses: tuple[Status, ...] = ()
    run_id: str | None = None
    provider: str | None = None
    created_before: datetime | None = None
    recipient_domain: str | None = None
    # The search box (docs/design.md, "The operators' page"): one string matched against the
    # step id, a recipient (address or @domain), Message-ID, provider message id, idempotency
    # key, run id and the enqueuing API key's name; any of them matching is a match.
    search: str | None = None
    # A case-insensitive substring of the request's subject, matched in the newest
    # SUBJECT_SCAN_CAP steps the other filters leave (StepReader.list_by_subject).
    subject: str | None = None
    limit: int | None = 50  # None: every matching row
    offset: int = 0


class EnqueueStore(Protocol):
    """``approval``: the policy each *new* step is judged by, in the enqueue's transaction
    (held, charged against the budgets, or refused with E_BUDGET). See docs/design.md,
    "Approvals and budgets". A held send charges no budget; its approval (a person's decision)
    charges none either. A repeat of a stored key is answered as its row is."""

    async def enqueue(
        self, request: ValidRequest, *, now: datetime | None = None, approval: ApprovalPolicy = ApprovalPolicy()
    ) -> EnqueueResult: ...

    async def enqueue_many(
        self,
        requests: Sequence[ValidRequest],
        *,
        now: datetime | None = None,
        approval: ApprovalPolicy = ApprovalPolicy(),
    ) -> list[EnqueueResult]: ...

    async def preview_holds(
        self, request: ValidRequest, approval: ApprovalPolicy, *, now: datetime | None = None
    ) -> list[dict[str, Any]]:
        """The holds (HoldRule dicts) the policy would give this request as a new step, read
        without writing (a dry run); [] when it would go out on its own."""
        ...

    async def budget_usage(self, *, now: datetime | None = None, limit: int = 20) -> list[dict[str, Any]]:
        """The budget counters of the current windows, most used first (`evq policy show`)."""
        ...

    async def find_by_key(self, request: ValidRequest) -> dict[str, Any] | None:
        """The step already stored under the request's idempotency key (a dry run's read); None: none."""
        ...


@dataclass(frozen=True, slots=True)
class SubjectPage:
    """A subject filter's answer: the page (newest first), how many steps the scan read
    (``scanned`` equal to ``cap``: older steps were not searched), and each state's hits among
    them (every state a key, 0 included)."""

    rows: list[StepSummary]
    scanned: int
    cap: int
    by_status: dict[str, int]

    @property
    def cut(self) -> bool:
        return self.scanned >= self.cap

    def total(self, statuses: Sequence[Status]) -> int:
        wanted = {str(s) for s in statuses} or set(self.by_status)
        return sum(n for status, n in self.by_status.items() if status in wanted)


class StepReader(Protocol):
    async def get_step(self, step_id: int) -> StepDetail: ...

    async def get_steps(self, step_ids: Sequence[int]) -> list[StepDetail]:
        """get_step of each id, read together from one snapshot, in the ids' order (a repeated
        id once); an id with no step is left out, not an error (a page of ids read just before
        some were pruned)."""
        ...

    async def list_steps(self, where: StepFilter, *, now: datetime | None = None) -> tuple[list[StepSummary], int]:
        """The page of steps ``where`` matches, and their total counted up to COUNT_CAP + 1
        (StatusCount.capped reads it)."""
        ...

    async def list_by_subject(self, where: StepFilter, *, now: datetime | None = None) -> SubjectPage:
        """The page of steps ``where`` matches, ``where.subject`` included, newest first, from
        the newest SUBJECT_SCAN_CAP steps its other filters (and states) leave. list_steps and
        count_by_status answer a filter with a subject from it, so no caller ignores it."""
        ...

    async def count_by_status(self, where: StepFilter) -> dict[str, StatusCount]:
        """Every state's count of the steps ``where`` matches (its ids, run, provider, age,
        domain and search; not its states, limit or offset), each capped at COUNT_CAP: the
        ops page's tabs. Every state is a key, 0 included."""
        ...

    async def get_run(self, run_id: str, *, limit: int, offset: int = 0) -> RunDetail:
        """A page of ``limit`` of the run's steps after ``offset``, in step_id order (the run's
        unique key: a page is read from its index, never the whole run), with their decisions
        and evidence, read from one snapshot; NotFound when the run has no step."""
        ...

    async def list_facts(self, step_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """What a list shows of each step beyond its summary, by step id (ids that do not exist
        are left out): ``message_id``, ``provider_message_id``, ``held_since``,
        ``hold_expires_at`` and ``hold`` (why it is held). One read for a page of rows, so a
        state's list shows its own columns without reading each step whole."""
        ...


class ResolveStore(Protocol):
    """An operator's verdict on a step (worker/resolution.py), with its evidence."""

    async def resolve(
        self,
        step_id: int,
        resolution: Resolution,
        *,
        actor: str,
        default_max_attempts: int,
        now: datetime | None = None,
    ) -> Resolved: ...
