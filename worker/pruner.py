"""The pruner: retention, the only path that removes evidence (evq prune).

Terminal steps (accepted, rejected) created and closed before a cutoff are
deleted with their evidence and decisions, a batch at a time, each batch in its
own transaction together with the prune_log row that records it: an interrupted
prune (Ctrl-C, a lost connection) leaves every finished batch done and logged
and the rest untouched. Rows that are not terminal (in flight, retryable,
unknown) are never touched, however old, and neither is a step a failure notice
that must stay still points at (it goes later, in the same batch as its notice).
The database enforces the same: the deletes happen inside ``evq_prune_batch``, a
function owned by the tables' owner (migrations/baseline/prune.sql), and the
append-only trigger refuses any DELETE of evidence made elsewhere, and inside it
refuses evidence of a step that is not terminal.

What is old is decided on the database's clock, and ``--older-than`` takes only
units nobody misreads: ``1m`` is refused (a minute, or a month?).

Refused enqueues (table enqueue_refusals) recorded before the same cutoff go too,
after the steps; the counts behind evq_enqueue_refusals_total are kept. Last, the
blast-radius counters (send_budgets) whose window closed before the cutoff: an hour's or
a day's once over, a run's once the run has no step left (at 100 million sends a day a
per-domain hourly budget alone writes a counter per domain and hour). The first-contact
memory (known_recipients) is kept: forgetting it would hold mail to known recipients again.
So is the key ledger (step_keys, invariant 12): each key's row gets its step's end in the batch
that deletes the step, and a repeat of that key is answered from it, never sent again.

Evidence is partitioned by its step's id (PostgreSQL, migrations/baseline/partitions.sql). Before the batches,
each partition whose steps all closed before the cutoff is sealed (it refuses new rows),
checked again, and dropped whole, with a prune_log row naming it: seconds for millions of
rows, where the batches would delete each row through the append-only trigger. Its steps
and decisions then go by the batches like any others, with no evidence left to delete.

Prune is a write command for administrators; it shares the service shape
(config with validation, ``run_once`` returning counts) so it can also run
periodically.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from evq.worker.errors import ConfigError, InvalidRequest, NotFound
from evq.worker.ports import PruneStore
from evq.worker.records import BudgetKey, PruneCounts

# Units of --older-than. "m" is not one of them: in a retention command many people
# read "1m" as a month, and a minute would delete what closed a minute ago.
RETENTION_UNITS: dict[str, timedelta] = {
    "s": timedelta(seconds=1),
    "min": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
    "mo": timedelta(days=30),
    "y": timedelta(days=365),
}
RETENTION_HELP = "s, min, h, d, w, mo (30 days) or y (365 days); e.g. 90d, 6mo, 1y"
MAX_RETENTION = timedelta(days=36500)
_RETENTION = re.compile(r"^(\d{1,9})\s*([a-z]+)$")


def parse_retention(text: str) -> timedelta:
    """--older-than of evq prune: a positive count and an unambiguous unit."""
    match = _RETENTION.match(text.strip().lower())
    unit = match[2] if match else None
    if match and unit == "m":
        raise InvalidRequest(
            [
                {
                    "field": "--older-than",
                    "message": f"{text[:40]!r} is ambiguous: write {match[1]}min for minutes "
                    f"or {match[1]}mo for months",
                }
            ]
        )
    if not match or unit not in RETENTION_UNITS:
        raise InvalidRequest(
            [{"field": "--older-than", "message": f"expected a count and a unit ({RETENTION_HELP}), got {text[:40]!r}"}]
        )
    duration = int(match[1]) * RETENTION_UNITS[unit]
    if duration > MAX_RETENTION:
        raise InvalidRequest(
            [{"field": "--older-than", "message": f"at most {MAX_RETENTION.days}d, got {text[:40]!r}"}]
        )
    return duration


@dataclass(frozen=True, slots=True)
class PrunerConfig:
    older_than: timedelta = timedelta(days=90)
    batch: int = 1000
    dry_run: bool = False
    # How often the service runs when it runs periodically.
    interval: float = 3600.0

    def validate(self) -> PrunerConfig:
        if self.older_than <= timedelta(0):
            raise ConfigError("--older-than must be a positive duration, e.g. 90d")
        if not 1 <= self.batch <= 100_000:
            raise ConfigError("--batch-size must be between 1 and 100000")
        if self.interval <= 0:
            raise ConfigError("the prune interval must be positive")
        return self


class Pruner:
    name = "pruner"

    def __init__(
        self,
        store: PruneStore,
        config: PrunerConfig,
        *,
        actor: str,
        progress: Callable[[PruneCounts], None] = lambda _: None,
        should_stop: Callable[[], bool] = lambda: False,
    ):
        self.store = store
        self.config = config.validate()
        self.interval = config.interval
        self.actor = actor
        self.progress = progress
        # Asked between batches (evq prune's first Ctrl-C): the batch in progress commits
        # with its prune_log row, then the run ends early and says so (``stopped``).
        self.should_stop = should_stop
        self.stopped = False
        self.last_cutoff: datetime | None = None

    async def run_once(self) -> PruneCounts:
        """Prune until nothing older than the cutoff is left (or count it, dry run).

        The cutoff is read from the database's clock once, at the start, and holds
        for every batch of the run (prune_log records it): the client's clock never
        decides what is old (a client a year ahead would delete what closed a
        minute ago)."""
        cutoff = await self.store.prune_cutoff(older_than=self.config.older_than)
        self.last_cutoff = cutoff
        if self.config.dry_run:
            counts = await self.store.prune_count(cutoff=cutoff)
            refused = await self.store.prune_refusals(cutoff=cutoff, limit=self.config.batch, dry_run=True)
            return replace(counts, refusals=refused, budgets=await self._budgets(cutoff, dry_run=True, total=counts))
        run = uuid.uuid4()
        total = PruneCounts()
        # Whole evidence partitions first: each one's rows go at once, and the batches below
        # then find its steps with no evidence left to delete. A partition that cannot go (a
        # step in it still open, or closed after the cutoff) is left to the batches.
        after: int | None = None
        while not self.should_stop():
            part = await self.store.prune_partition(
                cutoff=cutoff, actor=self.actor, run=run, batch=total.batches + 1, after=after
            )
            if part is None:
                break
            after = part.lo
            if part.dropped:
                total = total + PruneCounts(evidence=part.evidence, batches=1, partitions=1)
                self.progress(total)
            if part.busy:
                # A reader holds evidence: every later drop would queue for its lock too, with
                # every writer of evidence behind it. The batches take the rest; a later run
                # tries the partitions again.
                break
        while True:
            if self.should_stop():
                self.stopped = True
                return total
            counts = await self.store.prune_batch(
                cutoff=cutoff, limit=self.config.batch, actor=self.actor, run=run, batch=total.batches + 1
            )
            if counts.steps == 0:
                break
            total = total + counts
            self.progress(total)
        # Refused enqueues hold no evidence of a send: deleted by the same cutoff, a batch at a
        # time (each its own statement), after the steps; their counts (the metric) stay.
        while refused := await self.store.prune_refusals(cutoff=cutoff, limit=self.config.batch):
            total = replace(total, refusals=total.refusals + refused)
            self.progress(total)
        # The blast-radius counters of windows long over: nothing reads them again.
        return replace(total, budgets=await self._budgets(cutoff, dry_run=False, total=total))

    async def _budgets(self, cutoff: datetime, *, dry_run: bool, total: PruneCounts) -> int:
        """One pass over send_budgets, a batch at a time (each its own statement), reported as
        progress on top of ``total`` (not in a dry run, which reports at the end). A dry run
        counts a run's counter only if the run has no step now: it cannot see which runs this
        prune would empty."""
        closed = 0
        after: BudgetKey | None = None
        while True:
            part = await self.store.prune_budgets(cutoff=cutoff, limit=self.config.batch, after=after, dry_run=dry_run)
            closed += part.budgets
            if part.budgets and not dry_run:  # a dry run reports its count at the end only
                self.progress(replace(total, budgets=closed))
            if part.last is None:
                return closed
            if self.should_stop():  # a dry run's pass is as long: Ctrl-C ends it too
                self.stopped = True
                return closed
            after = part.last


def step_not_found(step_id: int, pruned: Mapping[str, Any] | None) -> NotFound:
    """E_NOT_FOUND for a step id no step has; when evq prune removed it, saying so, with what the
    key ledger kept (step_pruned in queries.sql): how it ended, when it went, its key and
    Message-ID. A repeat of its key is answered as it ended (invariant 12)."""
    if pruned is None:
        return NotFound(f"no step with id {step_id}", hint="`evq steps list` shows the ids")
    at = pruned["pruned_at"]
    return NotFound(
        f"step {step_id} was pruned on {at:%Y-%m-%d %H:%M:%S %Z}: it ended {pruned['status']}; its history is gone",
        hint="evq prune removed its evidence and decision; a repeat of its key is answered as it ended, never sent again",
        context={
            "pruned": True,
            "pruned_at": at.isoformat(),
            "status": pruned["status"],
            "reason": pruned["reason"],
            "closed_at": pruned["closed_at"].isoformat(),
            "run_id": pruned["run_id"],
            "step_id": pruned["step_id"],
            "idempotency_key": pruned["idempotency_key"],
            "message_id": pruned["message_id"],
            "provider": pruned["provider"],
        },
    )
