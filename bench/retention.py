"""The retention mode (issue 19, "Retention at scale"): evq prune by whole evidence partitions
against row-by-row batches, and claim and enqueue with few partitions against many.

One database is filled with SQL (``fill``, INSERT ... SELECT generate_series in step-id chunks)
with ``retention_rows`` evidence rows, 3 a step: steps accepted (a few rejected) and closed
100-200 days ago, a few unknown ones in one old partition (kept: not closed), and the newest 1%
closed a day ago (kept: after the cutoff). Before the fill the step sequence is set past the
steps to come and ``evq_evidence_partitions_ahead`` makes partitions of ``steps / PARTS`` ids
(the baseline's function, never DDL of ours), so the fill spans about PARTS partitions.

Then, alternately with a fresh database holding only the migration's partitions: the drain of
``--steps`` pending steps by one `evq worker` process through the null adapter (as the drain
mode), and single enqueues (as the enqueue mode); the WAL each drain wrote, per step.

Then the real ``Pruner.run_once`` (as `evq prune --older-than 90d` runs it) on the filled
database, its store wrapped only to time the partition phase and the batch phase apart. For
comparison, on the same machine, a second fill of one partition's worth of steps pruned by the
batches alone (``evq_prune_batch``, no partition dropped): measured for that slice, and scaled
per step to the whole fill (said so in its name). Afterwards every kept step (unknown, recent,
drained, enqueued) must still have every evidence row it had, and the counts must add up:
otherwise ImpossibleFigure stops the run.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from bench.config import Figure, ImpossibleFigure
from bench.drain import drain_once
from bench.enqueue import single_enqueues
from bench.prefill import bench_requests, policy
from evq.worker.records import BudgetKey, BudgetPrune, PartitionPrune, PruneCounts

if TYPE_CHECKING:
    from collections.abc import Callable

    from bench.harness import Bench
    from evq.worker.ports import PruneStore

PARTS = 15  # the filled steps span about this many partitions
CHUNK = 200_000  # steps per INSERT ... SELECT
UNKNOWN = 5  # unknown steps in one old partition: it must be kept
OLDER_THAN = timedelta(days=90)  # evq prune --older-than 90d
BATCH = 1000  # evq prune's default --batch-size
SEQ = "pg_get_serial_sequence('email_steps', 'id')"


@dataclass(frozen=True)
class Layout:
    """Where the fill's steps lie: ids ``base + 1`` to ``base + steps``, partitions of ``size``
    ids from ``base``; the unknown steps in the third partition, the recent ones last."""

    base: int
    steps: int
    size: int
    unknown: int = UNKNOWN
    recent_share: float = 0.01

    @classmethod
    def of(cls, base: int, rows: int, *, parts: int = PARTS, keep: bool = True) -> Layout:
        steps = rows // 3
        size = -(-steps // parts)
        return cls(base, steps, size, UNKNOWN if keep else 0, 0.01 if keep else 0.0)

    @property
    def unknown_lo(self) -> int:
        return self.base + 2 * self.size + 10 if self.unknown else 0

    @property
    def recent(self) -> int:
        return max(10, int(self.steps * self.recent_share)) if self.recent_share else 0

    @property
    def recent_lo(self) -> int:
        """The first recent step's id (none: past the fill)."""
        return self.base + self.steps - self.recent + 1

    def params(self, a: int, b: int) -> dict[str, Any]:
        return {
            "a": a,
            "b": b,
            "base": self.base,
            "n": self.steps,
            "u_lo": self.unknown_lo,
            "u_hi": self.unknown_lo + self.unknown - 1,
            "r_lo": self.recent_lo,
        }

    def expected_dropped(self, partitions: list[tuple[str, int, int]]) -> set[str]:
        """The partitions retention must drop: every one whose next step (id ``hi``) is old, the
        migration's empty ones among them, but the one holding the unknown steps. The seal stops
        at the first partition whose next step is recent: that one and all above it stay."""
        u = self.unknown_lo
        return {
            name
            for name, lo, hi in partitions
            if hi < self.recent_lo and hi <= self.base + self.steps and not (self.unknown and lo <= u < hi)
        }


# One row per step: old ones 200 to 100 days ago in id order, the recent ones in the last day.
_BASE = """
SELECT g, CASE WHEN g BETWEEN %(u_lo)s AND %(u_hi)s THEN 'unknown'
               WHEN g %% 50 = 0 THEN 'rejected' ELSE 'accepted' END AS status,
       CASE WHEN g >= %(r_lo)s THEN now() - interval '1 day' + (g - %(r_lo)s) * interval '1 second'
            ELSE now() - interval '200 days' + (g - %(base)s - 1) * (100.0 * 86400 / %(n)s) * interval '1 second'
       END AS created
FROM generate_series(%(a)s::bigint, %(b)s::bigint) g
"""

DECISIONS = f"""
INSERT INTO decisions (id, run_id, step_id, intent, model, tool, created_at)
SELECT b.g, 'ret-' || (b.g / 1000), 's' || b.g, 'retention', 'm', 'send_email', b.created
FROM ({_BASE}) b
"""

STEPS = f"""
INSERT INTO email_steps (id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
    payload_sha256, status, reason, attempts, maybe_delivered, provider_message_id, first_attempt_at,
    unknown_since, closed_at, created_at, updated_at)
SELECT b.g, 'ret-' || (b.g / 1000), 's' || b.g, b.g, 'ret:' || b.g, '<ret.' || b.g || '@example.org>', 'null',
       jsonb_build_object('to', jsonb_build_array(jsonb_build_object('email', 'u' || b.g || '@example.com')),
                          'subject', 'retention ' || b.g, 'text', 'an old message'),
       repeat('0', 64), b.status,
       CASE b.status WHEN 'accepted' THEN 'provider_accepted' WHEN 'rejected' THEN 'provider_rejected'
            ELSE 'ambiguous_response' END,
       1, b.status = 'unknown', CASE WHEN b.status = 'accepted' THEN 'null-' || b.g END,
       b.created + interval '1 second',
       CASE WHEN b.status = 'unknown' THEN b.created + interval '2 seconds' END,
       CASE WHEN b.status <> 'unknown' THEN b.created + interval '2 seconds' END,
       b.created, b.created + interval '2 seconds'
FROM ({_BASE}) b
"""

# Three rows a closed step (its attempt, its answer, the provider's delivery event), two an
# unknown one (no answer it could read), in time order as a worker writes them.
EVIDENCE = """
INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
                      provider_message_id, lease_token, latency_ms, created_at)
SELECT s.id, s.run_id, 1, e.kind, e.actor, e.from_status, e.to_status, e.outcome, e.reason, e.pmid,
       CASE WHEN e.kind <> 'delivery_event' THEN md5('lease:' || s.id)::uuid END, e.latency,
       s.created_at + e.after
FROM email_steps s
CROSS JOIN LATERAL (VALUES
    ('attempt_started', 'bench-worker', 'pending', 'in_flight', NULL, NULL, NULL, NULL::float8,
     interval '1 second', true),
    ('provider_response', 'bench-worker', 'in_flight', s.status, s.status, s.reason, s.provider_message_id,
     800.0, interval '2 seconds', true),
    ('delivery_event', 'webhook', NULL, NULL, NULL, 'delivered', s.provider_message_id, NULL,
     interval '60 seconds', s.status <> 'unknown')
) AS e(kind, actor, from_status, to_status, outcome, reason, pmid, latency, after, present)
WHERE s.id BETWEEN %(a)s AND %(b)s AND e.present
ORDER BY s.id, e.after
"""


def partitions(conn: psycopg.Connection[Any]) -> list[tuple[str, int, int]]:
    from evq.adapters.postgres.queries import Q

    return [(r[0], r[1], r[2]) for r in conn.execute(Q["evidence_partitions"])]


def fill(url: str, rows: int, *, keep: bool = True, progress: Callable[[str], None] = lambda _: None) -> Layout:
    """Fill the freshly migrated database at ``url`` (module docstring); VACUUM ANALYZE after."""
    with psycopg.connect(url, autocommit=True) as conn:
        base = int(conn.execute("SELECT max(hi) FROM evq_evidence_partitions()").fetchone()[0])
        layout = Layout.of(base, rows, keep=keep)
        # The sequence past the steps to come, then the partitions of the fill's size: the
        # function makes them from the highest one up to four beyond the newest step id.
        conn.execute(f"SELECT setval({SEQ}, %s)", (base + layout.steps,))
        conn.execute("SELECT evq_evidence_partitions_ahead(%s)", (layout.size,))
        started = time.perf_counter()
        for a in range(base + 1, base + layout.steps + 1, CHUNK):
            b = min(base + layout.steps, a + CHUNK - 1)
            params = layout.params(a, b)
            for sql in (DECISIONS, STEPS, EVIDENCE):
                conn.execute(sql, params)
            done = b - base
            progress(
                f"retention fill: {done:,} of {layout.steps:,} steps ({done / layout.steps:.0%}), "
                f"{time.perf_counter() - started:.0f}s"
            )
        conn.execute("SELECT setval(pg_get_serial_sequence('decisions', 'id'), %s)", (base + layout.steps,))
        progress("retention fill: VACUUM ANALYZE")
        conn.execute("VACUUM ANALYZE")
    return layout


@dataclass
class Timed:
    """A PruneStore that notes when each phase of run_once ran, passing every call on."""

    store: PruneStore
    partition_seconds: float = 0.0
    batch_seconds: float = 0.0
    parts: list[PartitionPrune] = field(default_factory=list)
    batches: PruneCounts = field(default_factory=PruneCounts)

    async def prune_cutoff(self, *, older_than: timedelta) -> datetime:
        return await self.store.prune_cutoff(older_than=older_than)

    async def prune_count(self, *, cutoff: datetime) -> PruneCounts:
        return await self.store.prune_count(cutoff=cutoff)

    async def prune_refusals(self, *, cutoff: datetime, limit: int, dry_run: bool = False) -> int:
        return await self.store.prune_refusals(cutoff=cutoff, limit=limit, dry_run=dry_run)

    async def prune_budgets(
        self, *, cutoff: datetime, limit: int, after: BudgetKey | None, dry_run: bool = False
    ) -> BudgetPrune:
        return await self.store.prune_budgets(cutoff=cutoff, limit=limit, after=after, dry_run=dry_run)

    async def evidence_partitions_ahead(self, steps: int) -> int:
        return await self.store.evidence_partitions_ahead(steps)

    async def prune_partition(
        self, *, cutoff: datetime, actor: str, run: uuid.UUID, batch: int, after: int | None
    ) -> PartitionPrune | None:
        started = time.perf_counter()
        part = await self.store.prune_partition(cutoff=cutoff, actor=actor, run=run, batch=batch, after=after)
        self.partition_seconds += time.perf_counter() - started
        if part is not None:
            self.parts.append(part)
        return part

    async def prune_batch(self, *, cutoff: datetime, limit: int, actor: str, run: uuid.UUID, batch: int) -> PruneCounts:
        started = time.perf_counter()
        counts = await self.store.prune_batch(cutoff=cutoff, limit=limit, actor=actor, run=run, batch=batch)
        self.batch_seconds += time.perf_counter() - started
        self.batches = self.batches + counts
        return counts


async def _prune(url: str, *, batches_only: bool) -> tuple[Timed, PruneCounts]:
    """The real Pruner.run_once (as evq prune runs it); ``batches_only``: evq_prune_batch alone,
    a batch at a time until none is left, no partition dropped (the row-by-row comparison)."""
    from evq.adapters.postgres.store import PostgresStore
    from evq.worker.pruner import Pruner, PrunerConfig

    store = await PostgresStore.open(url, max_size=1)
    try:
        timed = Timed(store)
        if not batches_only:
            total = await Pruner(timed, PrunerConfig(older_than=OLDER_THAN, batch=BATCH), actor="bench").run_once()
            return timed, total
        cutoff = await store.prune_cutoff(older_than=OLDER_THAN)
        run = uuid.uuid4()
        batch = 1
        # Each batch its own number, as the Pruner gives them (prune_log is unique on run, batch).
        while (await timed.prune_batch(cutoff=cutoff, limit=BATCH, actor="bench", run=run, batch=batch)).steps:
            batch += 1
        return timed, timed.batches
    finally:
        await store.close()


ELIGIBLE = (
    "s.status IN ('accepted', 'rejected') AND s.created_at < now() - %(older)s AND s.closed_at < now() - %(older)s"
)


@dataclass
class Snapshot:
    """What the filled database holds, before and after the prune: each kept step's evidence
    (count and sum of ids), the totals, what retention may take, each partition's rows."""

    kept: dict[int, tuple[int, int]]
    totals: dict[str, int]
    eligible: dict[str, int]
    rows: dict[str, int]
    ranges: list[tuple[str, int, int]]

    @classmethod
    def read(cls, url: str) -> Snapshot:
        p = {"older": OLDER_THAN}
        with psycopg.connect(url) as conn:
            kept = {
                r[0]: (r[1], r[2])
                for r in conn.execute(
                    f"SELECT s.id, count(e.id), coalesce(sum(e.id), 0) FROM email_steps s"
                    f" LEFT JOIN evidence e ON e.step_id = s.id WHERE NOT ({ELIGIBLE}) GROUP BY s.id",
                    p,
                )
            }
            totals = dict(
                zip(
                    ("steps", "evidence", "decisions"),
                    conn.execute(
                        "SELECT (SELECT count(*) FROM email_steps), (SELECT count(*) FROM evidence),"
                        " (SELECT count(*) FROM decisions)"
                    ).fetchone(),
                    strict=True,
                )
            )
            eligible = dict(
                zip(
                    ("steps", "evidence"),
                    conn.execute(
                        f"SELECT count(*), (SELECT count(*) FROM evidence e JOIN email_steps s ON s.id = e.step_id"
                        f" WHERE {ELIGIBLE}) FROM email_steps s WHERE {ELIGIBLE}",
                        p,
                    ).fetchone(),
                    strict=True,
                )
            )
            ranges = partitions(conn)
            rows = {name: int(conn.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]) for name, _, _ in ranges}
        return cls(kept, totals, eligible, rows, ranges)


def verify(before: Snapshot, after: Snapshot, total: PruneCounts, timed: Timed, layout: Layout) -> None:
    """Every kept step's evidence intact, the counts adding up, the right partitions dropped:
    otherwise ImpossibleFigure (a benchmark of a retention that loses kept rows is no figure)."""
    problems = []
    lost = [sid for sid, ev in before.kept.items() if after.kept.get(sid) != ev]
    if lost:
        problems.append(
            f"{len(lost)} kept steps lost evidence or went (e.g. step {lost[0]}: "
            f"{before.kept[lost[0]]} -> {after.kept.get(lost[0])})"
        )
    kept_rows = sum(n for n, _ in before.kept.values())
    expect = {
        "steps": before.eligible["steps"],
        "evidence": before.eligible["evidence"],
        "decisions": before.eligible["steps"],  # one decision a step, none shared
    }
    for what, n in expect.items():
        if getattr(total, what) != n:
            problems.append(f"pruned {getattr(total, what):,} {what}, but {n:,} were older than the cutoff")
        if after.totals[what] != before.totals[what] - getattr(total, what):
            problems.append(
                f"{what}: {before.totals[what]:,} before less {getattr(total, what):,} pruned "
                f"is not the {after.totals[what]:,} left"
            )
    if after.totals["evidence"] != kept_rows or after.eligible["steps"] != 0:
        problems.append(
            f"left {after.totals['evidence']:,} evidence rows and {after.eligible['steps']:,} steps older "
            f"than the cutoff; the kept steps had {kept_rows:,} rows"
        )
    dropped = {p.name for p in timed.parts if p.dropped}
    gone = set(before.rows) - set(after.rows)
    expected = layout.expected_dropped(before.ranges)
    if dropped != gone or gone != expected:
        problems.append(
            f"partitions dropped {sorted(dropped)}, gone {sorted(gone)}, expected {sorted(expected)} "
            "(all below the recent steps but the one with the unknown steps)"
        )
    in_parts = sum(p.evidence for p in timed.parts if p.dropped)
    if in_parts != sum(before.rows[n] for n in gone) or total.partitions != len(dropped):
        problems.append(f"{in_parts:,} evidence rows dropped with partitions, but they held {before.rows}")
    if problems:
        raise ImpossibleFigure("retention: " + "; ".join(problems))


def sizes(url: str) -> dict[str, float]:
    """Bytes on disk (heap, indexes, TOAST) per evidence row and per step (its row, and its
    decision's), from pg_total_relation_size over every evidence partition."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('evidence')),"
            " (SELECT count(*) FROM evidence),"
            " pg_total_relation_size('email_steps') + pg_total_relation_size('decisions'),"
            " (SELECT count(*) FROM email_steps)"
        ).fetchone()
    return {"evidence_bytes": float(row[0]), "evidence_rows": row[1], "step_bytes": float(row[2]), "steps": row[3]}


def wal_lsn(url: str) -> int:
    with psycopg.connect(url) as conn:
        return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])


def single_enqueue(url: str, n: int, run_id: str) -> float:
    """Steps/s of ``n`` single enqueues through the Python API, autocommit (as the enqueue mode)."""
    with psycopg.connect(url, autocommit=True) as conn:
        return single_enqueues(conn, bench_requests(n, run_id=run_id), policy())[0]


def count_partitions(url: str) -> int:
    with psycopg.connect(url) as conn:
        return len(partitions(conn)) + 1  # and the overflow


def mode_retention(bench: Bench) -> None:
    c = bench.config
    few_name = bench.db.create(bench.db.template)
    few_url = bench.db.url(few_name)
    many_name = bench.db.create(bench.db.template)
    many_url = bench.db.url(many_name)
    started = time.perf_counter()
    layout = fill(many_url, c.retention_rows, progress=bench.progress)
    fill_seconds = time.perf_counter() - started
    size = sizes(many_url)
    few, many = count_partitions(few_url), count_partitions(many_url)
    bench.notes.append(
        f"retention: {size['evidence_rows']:,} evidence rows, {size['steps']:,} steps filled in {fill_seconds:.0f}s "
        f"(partitions of {layout.size:,} step ids from id {layout.base:,}; {layout.unknown} unknown steps, "
        f"{layout.recent:,} closed a day ago)"
    )
    label = f"{many} evidence partitions, {size['evidence_rows']:,} rows"

    # Claim+record and enqueue, few partitions (a fresh database) and many (the filled one),
    # alternated run by run; the many side's drained and enqueued steps are recent: kept.
    drains: dict[str, list[float]] = {"few": [], "many": []}
    wal: list[float] = []
    for run in range(c.runs):
        for side, url in (("few", few_url), ("many", many_url)):
            lsn = wal_lsn(url)
            drains[side].append(drain_once(bench, 1, url=url, run_id=f"ret-{side}-{run}")[0])
            if side == "many":
                wal.append((wal_lsn(url) - lsn) / c.steps)
    enqueues: dict[str, list[float]] = {"few": [], "many": []}
    for run in range(c.runs):
        for side, url in (("few", few_url), ("many", many_url)):
            enqueues[side].append(single_enqueue(url, c.enqueue_single, f"ret-enq-{side}-{run}"))
    for what, unit, values in (
        ("evq drain, 1 process", "steps/s", drains),
        ("evq single enqueue", "steps/s", enqueues),
    ):
        bench.add(Figure("retention", f"{what}, {few} evidence partitions, empty", unit, values["few"]))
        fig = bench.add(Figure("retention", f"{what}, {label}", unit, values["many"]))
        fig.ratios["few_partitions"] = statistics.median(
            m / f for m, f in zip(values["many"], values["few"], strict=True)
        )
    bench.add(
        Figure(
            "retention",
            f"WAL per drained step, {label}",
            "bytes",
            wal,
            note="pg_current_wal_lsn before and after each drain: the whole server's WAL, an upper bound",
        )
    )
    bench.add(Figure("retention", "evidence bytes per row", "bytes", [size["evidence_bytes"] / size["evidence_rows"]]))
    bench.add(
        Figure(
            "retention",
            "step bytes per step (email_steps and decisions)",
            "bytes",
            [size["step_bytes"] / size["steps"]],
        )
    )
    bench.db.drop(few_name, at_once=True)  # the few-partitions database: done with

    # The prune: Pruner.run_once, as evq prune --older-than 90d runs it.
    bench.progress("retention: evq prune (Pruner.run_once) on the filled database")
    before = Snapshot.read(many_url)
    timed, total = asyncio.run(_prune(many_url, batches_only=False))
    after = Snapshot.read(many_url)
    verify(before, after, total, timed, layout)
    dropped = [p for p in timed.parts if p.dropped]
    filled = [p for p in dropped if p.hi > layout.base]
    bench.add(
        Figure(
            "retention",
            f"prune, partition phase: {len(dropped)} partitions dropped ({len(filled)} filled), "
            f"{sum(p.evidence for p in dropped):,} evidence rows",
            "s",
            [timed.partition_seconds],
            note=f"seal, check and DROP of each, and the seal check of the {len(before.rows) - len(dropped)} kept",
        )
    )
    bench.add(Figure("retention", "prune: partitions dropped", "partitions", [float(len(dropped))]))
    bench.add(
        Figure(
            "retention",
            "prune: evidence rows dropped with partitions",
            "rows",
            [float(sum(p.evidence for p in dropped))],
        )
    )
    bench.add(
        Figure(
            "retention",
            f"prune, batch phase: {timed.batches.steps:,} steps, {timed.batches.decisions:,} decisions, "
            f"{timed.batches.evidence:,} evidence rows by rows",
            "s",
            [timed.batch_seconds],
            note=f"evq_prune_batch, {BATCH} steps a batch",
        )
    )
    bench.db.drop(many_name, at_once=True)

    # The comparison: one partition's worth of steps pruned by rows alone, on the same machine.
    slice_name = bench.db.create(bench.db.template)
    slice_url = bench.db.url(slice_name)
    bench.progress(f"retention: {layout.size:,} steps (one partition's worth) to prune by rows alone")
    part = fill(slice_url, 3 * layout.size, keep=False)
    rows_before = Snapshot.read(slice_url)
    rows_timed, rows_total = asyncio.run(_prune(slice_url, batches_only=True))
    if rows_total.steps != rows_before.eligible["steps"] or rows_total.evidence != rows_before.eligible["evidence"]:
        raise ImpossibleFigure(
            f"retention: the row-by-row prune took {rows_total.steps:,} steps and {rows_total.evidence:,} rows of "
            f"{rows_before.eligible['steps']:,} and {rows_before.eligible['evidence']:,}"
        )
    bench.db.drop(slice_name, at_once=True)
    per_partition = timed.partition_seconds / len(filled) if filled else None
    measured = bench.add(
        Figure(
            "retention",
            f"row-by-row prune of one partition's worth ({part.steps:,} steps, {rows_total.evidence:,} evidence rows)",
            "s",
            [rows_timed.batch_seconds],
            note="measured: evq_prune_batch alone on a second fill, no partition dropped",
        )
    )
    measured.ratios["partition_drop"] = per_partition / rows_timed.batch_seconds if per_partition else None
    scaled = bench.add(
        Figure(
            "retention",
            f"row-by-row prune of the whole fill ({total.steps:,} steps), scaled",
            "s",
            [rows_timed.batch_seconds * total.steps / rows_total.steps],
            note="scaled per step from the measured slice above, not measured",
        )
    )
    scaled.ratios["partitions_then_batches"] = (timed.partition_seconds + timed.batch_seconds) / scaled.median
