"""Frozen records that cross the store port. Built from rows with ``from_row``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, TypeAlias, TypeVar
from uuid import UUID

from evq.worker.states import Reason, Status

_Record = TypeVar("_Record")


def positional_builder(cls: type[_Record]) -> Callable[..., _Record]:
    """A constructor of ``cls``, a frozen slots dataclass without ``__post_init__``, that takes
    every field's value in field order (no defaults) and makes the same instance (same class,
    equal, hashed, frozen) for a fifth of the cost: a frozen class's ``__init__`` sets each field
    through ``object.__setattr__`` (about 1,500 machine instructions a field on CPython 3.11),
    while this sets them on a twin class of the same slots, as plain attribute stores, and then
    gives the object its class (``__class__`` assignment, allowed between identical layouts).
    For the few records a send makes (the claimed row, its request, its transition, its result)."""
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if getattr(cls, "__slots__", None) != names or hasattr(cls, "__post_init__") or "_b_" in "".join(names):
        raise TypeError(f"{cls.__name__} is not a slots dataclass without __post_init__ (and fields without _b_)")
    twin = type(f"_{cls.__name__}Parts", (), {"__slots__": names})
    stores = "".join(f"    _b_record.{name} = {name}\n" for name in names)
    source = (
        f"def build({', '.join(names)}):\n    _b_record = _b_new(_b_twin)\n{stores}"
        "    _b_record.__class__ = _b_cls\n    return _b_record\n"
    )
    namespace: dict[str, Any] = {"_b_new": object.__new__, "_b_twin": twin, "_b_cls": cls}
    exec(source, namespace)  # the names are the dataclass's own field names, checked above
    build: Callable[..., _Record] = namespace["build"]
    build.__qualname__ = f"positional_builder({cls.__name__})"
    return build


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    id: int
    run_id: str
    step_id: str
    idempotency_key: str
    message_id: str
    status: Status
    created: bool
    # "unresolvable": the step's provider could never settle a lost answer (worker/enqueue.py,
    # flag_ambiguity); None: it could, or nobody asked (the store's own results).
    ambiguity: str | None = None
    # The stored step's provider, when the store said it (the ambiguity is that provider's);
    # not in the answer's JSON.
    provider: str | None = None
    # A stored row's reason and maybe_delivered (a repeat answered as its row is): what the
    # ambiguity verdict (worker/verdict.py) needs; a new step has neither. Not in to_dict.
    reason: str | None = None
    maybe_delivered: bool = False
    # Why a held step waits for a person ({"rules": [...]}, email_steps.hold); None: not held.
    hold: dict[str, Any] | None = None
    # A repeat of a key whose step evq prune removed, answered from the key ledger (step_keys,
    # invariant 12) as the step ended: its status, Message-ID and id; nothing was sent again.
    pruned: bool = False
    # When a held step is rejected unless a person decides (approval_expired); None: not held,
    # or held sends never expire. In the answer's ``approval``, not in to_dict.
    hold_expires_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "idempotency_key": self.idempotency_key,
            "message_id": self.message_id,
            "status": str(self.status),
            "created": self.created,
            "ambiguity": self.ambiguity,
            "ambiguity_hint": AMBIGUITY_HINTS.get(self.ambiguity) if self.ambiguity else None,
            "hold": self.hold,
            "pruned": self.pruned,
        }


# What each ``ambiguity`` means for the caller, in words (every interface shows it).
AMBIGUITY_HINTS: dict[str, str] = {
    "unresolvable": (
        "this provider neither deduplicates our key, nor can be asked about a message, nor reports "
        "deliveries by webhook: if its answer to this send is lost, the step stays unknown until an "
        "operator resolves it (`evq providers list` shows each provider's profile; "
        "EVQ_REFUSE_UNRESOLVABLE=on refuses such sends)"
    ),
}


@dataclass(frozen=True, slots=True)
class ClaimedStep:
    """A step this worker holds the lease of, for one attempt."""

    id: int
    run_id: str
    step_id: str
    idempotency_key: str
    message_id: str
    provider: str
    payload: dict[str, Any]
    attempt: int
    max_attempts: int | None
    lease_token: UUID
    lease_seconds: float
    # Seconds left, at claim time, in which the provider still dedupes our key; None: it never does.
    dedupe_remaining: float | None
    maybe_delivered: bool
    created_at: datetime
    # Attempts not charged to the message: provider-level faults (worker/circuit.py), and
    # the attempts an operator's requeue of a dead letter forgave.
    uncharged_attempts: int = 0
    # Seconds, by the database clock at claim time, since the retry budget started counting
    # (the enqueue, or an operator's requeue): EVQ_RETRY_FOR is measured against it.
    budget_age: float = 0.0

    @property
    def charged_attempts(self) -> int:
        return self.attempt - self.uncharged_attempts

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ClaimedStep:
        return cls(
            id=row["id"],
            run_id=row["run_id"],
            step_id=row["step_id"],
            idempotency_key=row["idempotency_key"],
            message_id=row["message_id"],
            provider=row["provider"],
            payload=row["payload"],
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            lease_token=row["lease_token"],
            lease_seconds=float(row["lease_seconds"]),
            dedupe_remaining=None if row["dedupe_remaining"] is None else float(row["dedupe_remaining"]),
            maybe_delivered=row["maybe_delivered"],
            created_at=row["created_at"],
            uncharged_attempts=row.get("uncharged_attempts", 0),
            budget_age=float(row.get("budget_age") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class Transition:
    """The outcome of one attempt and the state it moves the step to, fenced by the lease."""

    step_id: int
    lease_token: UUID
    attempt: int
    to_status: Status
    reason: Reason
    outcome: str  # the adapter's answer: accepted | rejected | retryable | unknown
    provider_message_id: str | None = None
    retry_delay: float | None = None  # seconds until the next attempt, for to_status=retryable
    maybe_delivered: bool = False
    latency_ms: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    # False: the attempt hit a provider-level fault and is not counted against the message.
    charged: bool = True

    @property
    def definite(self) -> bool:
        """A definite answer may settle a row rescued to ``unknown`` after the fact
        (step_record_late): one that closes the step, accepted or rejected."""
        return self.to_status in (Status.ACCEPTED, Status.REJECTED)


@dataclass(frozen=True, slots=True)
class RecordResult:
    step_id: int
    applied: bool  # the fenced transition took effect
    settled: bool = False  # fenced out, but a definite answer closed the rescued row
    duplicate: bool = False  # this attempt's outcome was already recorded (a retried commit)


@dataclass(frozen=True, slots=True)
class RescueCounts:
    unknown: int = 0
    retryable: int = 0
    window_closed: int = 0

    @property
    def total(self) -> int:
        return self.unknown + self.retryable + self.window_closed


@dataclass(frozen=True, slots=True)
class UnknownStep:
    """An unknown row the reconciler holds for one lookup (no lock, a short hold)."""

    id: int
    run_id: str
    step_id: str
    idempotency_key: str
    message_id: str
    provider: str
    reconcile_checks: int  # lookups already made for this row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> UnknownStep:
        return cls(**{k: row[k] for k in cls.__slots__})


@dataclass(frozen=True, slots=True)
class ReconcileCounts:
    accepted: int = 0  # the provider has the message: closed as accepted
    absent: int = 0  # the provider says it has no such message: still unknown
    failed: int = 0  # the provider could not be asked; the row is tried again later
    lost: int = 0  # the row left unknown while the provider was asked (an operator closed it)

    @property
    def total(self) -> int:
        return self.accepted + self.absent + self.failed + self.lost


@dataclass(frozen=True, slots=True)
class StepSummary:
    id: int
    run_id: str
    step_id: str
    status: Status
    reason: str | None
    provider: str
    attempts: int
    recipients: list[str]
    subject: str
    created_at: datetime
    updated_at: datetime
    unknown_since: datetime | None
    closed_at: datetime | None
    age_seconds: float
    # Whether an attempt may have reached the provider: the ambiguity verdict's input
    # (worker/verdict.py), so a list says safe_to_retry without reading each step.
    maybe_delivered: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StepSummary:
        return cls(**{k: row[k] for k in cls.__slots__})


@dataclass(frozen=True, slots=True)
class StepDetail:
    step: dict[str, Any]
    decision: dict[str, Any] | None
    evidence: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class QueueStats:
    """What the database says about the queue right now (read at scrape time for /metrics)."""

    steps: dict[str, int]  # every status, 0 when none
    unknown_oldest_age: float  # seconds; 0 when no row is unknown
    unknown_age_sum: float
    # Cumulative (le, rows aged at most le seconds), ascending, without +Inf (that is steps["unknown"]).
    unknown_buckets: tuple[tuple[float, int], ...]
    pending_oldest_age: float  # seconds the oldest row claimable now has waited since it became claimable
    in_flight_expired: int
    # Statuses whose count is the planner's estimate rather than an exact count.
    estimated: tuple[str, ...] = ()
    # provider -> circuit state (closed, half_open, open), for providers that ever had one.
    circuits: dict[str, str] = field(default_factory=dict)
    # Rows claimable now, by how long each has waited since it became due: cumulative
    # (le, rows), ascending, without +Inf (that is pending_due), and their sum of ages.
    pending_due: int = 0
    pending_age_sum: float = 0.0
    pending_buckets: tuple[tuple[float, int], ...] = ()
    # (interface, field) -> refused enqueues ever recorded (enqueue_refusal_counts), every process's.
    refusals: dict[tuple[str, str], int] = field(default_factory=dict)
    held_oldest_age: float = 0.0  # seconds the oldest held send has waited for a person; 0 when none
    # Evidence partitions starting above the newest step id (the keeper keeps four), and the rows
    # the overflow partition holds; None where the store has no partitions.
    evidence_partitions_ahead: int | None = None
    evidence_overflow_rows: int | None = None


@dataclass(frozen=True, slots=True)
class Resolved:
    """An operator's close that took effect."""

    step_id: int
    run_id: str
    to_status: Status
    evidence_id: int
    resolved_at: datetime
    attempts: int
    max_attempts_before: int | None
    max_attempts_after: int | None
    # unknown, or rejected for a dead-letter requeue (attempts or retry budget spent).
    from_status: Status = Status.UNKNOWN

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.step_id,
            "run_id": self.run_id,
            "from_status": str(self.from_status),
            "to_status": str(self.to_status),
            "evidence_id": self.evidence_id,
            "resolved_at": self.resolved_at,
            "attempts": self.attempts,
            "max_attempts_raised": self.max_attempts_after != self.max_attempts_before,
            "max_attempts": self.max_attempts_after,
        }


@dataclass(frozen=True, slots=True)
class RunDetail:
    """One page of a run: its steps (in step_id order), their decisions and evidence, and the
    run's steps counted up to COUNT_CAP + 1 (``total``)."""

    run_id: str
    steps: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    evidence: list[dict[str, Any]]
    total: int


@dataclass(frozen=True, slots=True)
class PruneCounts:
    """What a prune batch (or a whole pass, or a dry run's count) covers."""

    steps: int = 0
    evidence: int = 0
    decisions: int = 0
    batches: int = 0
    # Refused enqueues recorded before the cutoff (enqueue_refusals), pruned after the steps.
    refusals: int = 0
    # Evidence partitions dropped whole (their rows are in ``evidence``; PostgreSQL only).
    partitions: int = 0
    # Blast-radius counters (send_budgets) whose window closed before the cutoff.
    budgets: int = 0

    @property
    def total(self) -> int:
        return self.steps + self.evidence + self.decisions + self.refusals + self.budgets

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            self.steps + other.steps,
            self.evidence + other.evidence,
            self.decisions + other.decisions,
            self.batches + other.batches,
            self.refusals + other.refusals,
            self.partitions + other.partitions,
            self.budgets + other.budgets,
        )


# A blast-radius counter's key in send_budgets: (budget, scope, window start).
BudgetKey: TypeAlias = tuple[str, str, datetime]


@dataclass(frozen=True, slots=True)
class BudgetPrune:
    """One batch of the counters' pass: how many closed (deleted, or counted in a dry run),
    and the last key it read, where the next batch starts (None: the pass is done)."""

    budgets: int
    last: BudgetKey | None


@dataclass(frozen=True, slots=True)
class PartitionPrune:
    """One evidence partition retention sealed and then dropped, or gave back (``dropped``
    false: a step of its range was not closed before the cutoff after all, or the drop
    could not take its lock in time). Its range is step ids ``lo`` to ``hi - 1``."""

    name: str
    lo: int
    hi: int
    dropped: bool
    evidence: int = 0
    # Not dropped because readers kept evidence's lock past the drop's timeout: the run tries
    # no further partition (each try queues every writer of evidence behind it).
    busy: bool = False


@dataclass(frozen=True, slots=True)
class RedactCounts:
    """What a content-retention batch (or a whole pass) redacted (worker/content_retention.py)."""

    redacted: int = 0
    batches: int = 0

    @property
    def total(self) -> int:
        return self.redacted


@dataclass(frozen=True, slots=True)
class Grant:
    """What one take from a provider's bucket gave."""

    granted: int
    # Seconds until the provider's pause ends (0: not paused), by the database clock.
    paused_for: float = 0.0
    # Seconds until the bucket holds its next whole token (0 when it holds one now).
    next_token_in: float = 0.0


# The hot path's constructors (positional_builder): every field's value, in field order.
build_claimed_step = positional_builder(ClaimedStep)
build_transition = positional_builder(Transition)
build_record_result = positional_builder(RecordResult)
