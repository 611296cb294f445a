"""Retention (evq prune) against a real database: what goes, what stays, what is
logged, and that the append-only guard still refuses everything else.

The cutoff comes from the database's clock (no `now` override reaches it), so the
history here is written at times relative to the real clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store import PostgresStore
from evq.worker.approval_policy import ApprovalPolicy, Budget
from evq.worker.backoff import Backoff
from evq.worker.outcomes import Accepted, Rejected, Unknown
from evq.worker.pruner import Pruner, PrunerConfig
from evq.worker.records import PruneCounts
from evq.worker.states import Status
from evq.worker.transitions import decide
from tests.support import rows, valid

NOW = datetime.now(UTC)
OLD = NOW - timedelta(days=120)
RECENT = NOW - timedelta(days=10)
PRUNE_ON = "SELECT set_config('evq.pruning', 'on', true)"


def db_now(url: str) -> datetime:
    return rows(url, "SELECT now() AS n")[0]["n"]


async def settled(store: PostgresStore, outcome, *, at: datetime, **request) -> int:
    """A step enqueued, claimed and answered at `at`: two evidence rows and a decision."""
    step = await store.enqueue(valid(**request), now=at)
    [claimed] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=at)
    transition = decide(claimed, outcome, default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
    await store.record([transition], actor="w", now=at)
    return step.id


async def history(store: PostgresStore) -> dict[str, list[int]]:
    return {
        "old_accepted": [await settled(store, Accepted("pm"), at=OLD) for _ in range(5)],
        "old_rejected": [await settled(store, Rejected("550 no"), at=OLD)],
        "old_unknown": [await settled(store, Unknown("reset after the dot"), at=OLD)],
        "old_pending": [(await store.enqueue(valid(), now=OLD)).id],
        "recent_accepted": [await settled(store, Accepted("pm"), at=RECENT)],
    }


def count(url: str, sql: str, params=None) -> int:
    return rows(url, sql, params)[0]["n"]


def pruner(store, batch: int = 2, **kw) -> Pruner:
    return Pruner(store, PrunerConfig(older_than=timedelta(days=90), batch=batch, **kw), actor="test-admin")


async def test_prune_removes_old_terminal_steps_with_their_evidence_and_logs_each_batch(store, db_url):
    made = await history(store)
    doomed = made["old_accepted"] + made["old_rejected"]
    progress: list[PruneCounts] = []
    before = db_now(db_url)
    counts = await Pruner(
        store, PrunerConfig(older_than=timedelta(days=90), batch=2), actor="test-admin", progress=progress.append
    ).run_once()
    after = db_now(db_url)

    assert (counts.steps, counts.evidence, counts.decisions, counts.batches) == (6, 12, 6, 3)
    assert [p.steps for p in progress] == [2, 4, 6]
    left = {r["id"] for r in rows(db_url, "SELECT id FROM steps_now")}
    assert left == set(made["old_unknown"] + made["old_pending"] + made["recent_accepted"])
    assert count(db_url, "SELECT count(*) AS n FROM evidence WHERE step_id = ANY(%s)", (doomed,)) == 0
    # Decisions go with their steps; the others keep theirs.
    assert count(db_url, "SELECT count(*) AS n FROM decisions") == len(left)
    assert (
        count(
            db_url,
            "SELECT count(*) AS n FROM steps_now s LEFT JOIN decisions d ON d.id = s.decision_id WHERE d.id IS NULL",
        )
        == 0
    )
    log = rows(db_url, "SELECT * FROM prune_log ORDER BY batch")
    assert [r["batch"] for r in log] == [1, 2, 3] and len({r["run"] for r in log}) == 1
    assert sum(r["steps"] for r in log) == 6 and sum(r["evidence"] for r in log) == 12
    assert {r["actor"] for r in log} == {"test-admin"} and len({r["cutoff"] for r in log}) == 1
    # One cutoff for the whole run, taken from the database's clock.
    assert before - timedelta(days=90) <= log[0]["cutoff"] <= after - timedelta(days=90)
    # Nothing older is left: a second pass deletes and logs nothing.
    assert await pruner(store).run_once() == PruneCounts()
    assert count(db_url, "SELECT count(*) AS n FROM prune_log") == 3


async def test_dry_run_counts_and_deletes_nothing(store, db_url):
    await history(store)
    before = count(db_url, "SELECT count(*) AS n FROM evidence")
    counts = await pruner(store, dry_run=True).run_once()
    assert (counts.steps, counts.evidence, counts.decisions) == (6, 12, 6)
    assert count(db_url, "SELECT count(*) AS n FROM evidence") == before
    assert count(db_url, "SELECT count(*) AS n FROM prune_log") == 0


async def test_a_step_closed_recently_is_kept_even_if_created_long_ago(store, db_url):
    [i] = [await settled(store, Unknown("lost"), at=OLD)]
    # An operator closed it yesterday: its closing evidence is fresh, so it stays.
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE email_steps SET status = 'accepted', unknown_since = NULL, closed_at = %s WHERE id = %s",
            (NOW - timedelta(days=1), i),
        )
    assert await pruner(store).run_once() == PruneCounts()


async def test_an_interrupted_prune_keeps_its_finished_batches_and_nothing_else(store, db_url):
    await history(store)

    def interrupt(total: PruneCounts) -> None:
        raise KeyboardInterrupt  # Ctrl-C right after the first batch committed

    with pytest.raises(KeyboardInterrupt):
        await Pruner(
            store, PrunerConfig(older_than=timedelta(days=90), batch=2), actor="a", progress=interrupt
        ).run_once()
    assert count(db_url, "SELECT count(*) AS n FROM steps_now") == 9 - 2
    assert [(r["batch"], r["steps"]) for r in rows(db_url, "SELECT * FROM prune_log")] == [(1, 2)]


async def test_a_batch_cancelled_midway_rolls_back_whole(store, db_url):
    await history(store)
    steps_before = count(db_url, "SELECT count(*) AS n FROM steps_now")
    evidence_before = count(db_url, "SELECT count(*) AS n FROM evidence")
    async with await psycopg.AsyncConnection.connect(db_url) as blocker:
        # The batch deletes, then waits to write its prune_log row: cancel it there.
        await blocker.execute("LOCK TABLE prune_log IN EXCLUSIVE MODE")
        task = asyncio.create_task(pruner(store).run_once())
        while not count(
            db_url, "SELECT count(*) AS n FROM pg_locks WHERE NOT granted AND relation = 'prune_log'::regclass"
        ):
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await blocker.rollback()
    assert count(db_url, "SELECT count(*) AS n FROM steps_now") == steps_before
    assert count(db_url, "SELECT count(*) AS n FROM evidence") == evidence_before
    assert count(db_url, "SELECT count(*) AS n FROM prune_log") == 0


REFUSED_ALWAYS = [
    "DELETE FROM evidence",
    "DELETE FROM decisions",
    "UPDATE evidence SET actor = 'someone else'",
    "UPDATE decisions SET intent = 'rewritten'",
    "TRUNCATE evidence CASCADE",
    "TRUNCATE decisions CASCADE",
    "DELETE FROM prune_log",
    "UPDATE prune_log SET steps = 0",
    "TRUNCATE prune_log",
]
REFUSED_EVEN_WITH_THE_SWITCH = [
    # The prune switch does not open UPDATE or TRUNCATE...
    "UPDATE evidence SET actor = 'someone else'",
    "TRUNCATE evidence CASCADE",
    # ...nor DELETE of the evidence of a step that is not terminal...
    "DELETE FROM evidence WHERE step_id IN (SELECT id FROM email_steps WHERE status = 'unknown')",
    # ...nor anything on the prune log itself.
    "DELETE FROM prune_log",
]


@pytest.mark.parametrize(
    "switch, sql",
    [(False, sql) for sql in REFUSED_ALWAYS] + [(True, sql) for sql in REFUSED_EVEN_WITH_THE_SWITCH],
)
async def test_history_refuses_every_other_change(store, db_url, switch, sql):
    await history(store)
    await pruner(store).run_once()  # so prune_log has rows too
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        if switch:
            conn.execute(PRUNE_ON)
        conn.execute(sql)


def test_the_switch_lasts_one_transaction_only(db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute(PRUNE_ON)
        conn.commit()
        assert conn.execute("SELECT coalesce(current_setting('evq.pruning', true), '')").fetchone()[0] == ""


def test_prune_finds_its_rows_through_an_index(db_url):
    """Not a timed test: the batch statement inside evq_prune_batch reads
    ix_email_steps_status_created_at, never the whole table (auto_explain shows the
    plan of the statement nested in the function)."""
    plans: list[str] = []
    with psycopg.connect(db_url) as conn:
        conn.execute(
            """
            INSERT INTO decisions (id, run_id, step_id) SELECT g, 'r', 's' || g FROM generate_series(1, 20000) g;
            INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                                     payload_sha256, status, closed_at, attempts, first_attempt_at, created_at)
            SELECT 'r', 's' || g, g, 'k' || g, '<m' || g || '@x>', 'smtp', '{}', repeat('a', 64), 'accepted',
                   now() - interval '1 day', 1, now() - interval '1 day', now() - make_interval(days => g % 200)
            FROM generate_series(1, 20000) g;
            ANALYZE email_steps;
            """
        )
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        conn.execute("LOAD 'auto_explain'")
        for setting, value in [("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_level", "notice")]:
            conn.execute(f"SET auto_explain.{setting} = {value}")
        conn.execute(
            Q["steps_prune"],
            {
                "cutoff": datetime.now(UTC) - timedelta(days=190),
                "limit": 1000,
                "actor": "a",
                "run": "00000000-0000-0000-0000-000000000000",
                "batch": 1,
            },
        ).fetchone()
        conn.rollback()
    nested = [p for p in plans if "LIMIT p_limit" in p or "FOR UPDATE OF s SKIP LOCKED" in p]
    assert nested, plans
    assert all("ix_email_steps_status_created_at" in p and "Seq Scan on email_steps" not in p for p in nested), nested


NOTIFY = "agent-inbox@example.org"


async def with_notice(store: PostgresStore, db_url: str, *, at: datetime, notice_outcome, notice_at: datetime):
    """An original rejected at `at` whose failure notice (a step of its own, notice_of
    pointing at it) is answered with `notice_outcome` at `notice_at` (None: still pending)."""
    original = await settled(store, Rejected("550 no such user"), at=at, notify=NOTIFY)
    [notice] = rows(db_url, "SELECT id FROM steps_now WHERE notice_of = %s", (original,))
    if notice_outcome is not None:
        [claimed] = await store.claim(
            owner="w", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=notice_at
        )
        assert claimed.id == notice["id"]
        transition = decide(
            claimed, notice_outcome, default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False
        )
        await store.record([transition], actor="w", now=notice_at)
    return original, notice["id"]


async def test_a_step_a_notice_points_at_is_pruned_with_its_notice_never_before_it(store, db_url):
    # Both old and settled: they go, together, even one root per batch.
    both_old = await with_notice(store, db_url, at=OLD, notice_outcome=Accepted("pm"), notice_at=OLD)
    # The notice was answered recently: it stays, so its original stays too.
    notice_recent = await with_notice(store, db_url, at=OLD, notice_outcome=Unknown("lost"), notice_at=OLD)
    with psycopg.connect(db_url) as conn:  # an operator closed the unknown notice yesterday
        conn.execute(
            "UPDATE email_steps SET status = 'accepted', unknown_since = NULL, closed_at = %s WHERE id = %s",
            (NOW - timedelta(days=1), notice_recent[1]),
        )
    plain = await settled(store, Accepted("pm"), at=OLD)
    # The notice is still pending (not terminal): neither goes, the original waits for it.
    # (Made last: the helpers claim whatever is due.)
    notice_pending = await with_notice(store, db_url, at=OLD, notice_outcome=None, notice_at=OLD)

    def evidence_of(ids):
        return count(db_url, "SELECT count(*) AS n FROM evidence WHERE step_id = ANY(%s)", (list(ids),))

    doomed = [*both_old, plain]

    dry = await pruner(store, batch=1, dry_run=True).run_once()
    counts = await pruner(store, batch=1).run_once()

    # The dry run counted exactly what the run deleted.
    assert (dry.steps, dry.evidence, dry.decisions) == (counts.steps, counts.evidence, counts.decisions)
    assert counts.steps == 3 and counts.decisions == 3 and counts.evidence > 0
    left = {r["id"] for r in rows(db_url, "SELECT id FROM steps_now")}
    assert left == {*notice_pending, *notice_recent}
    assert evidence_of(doomed) == 0 and evidence_of(left) > 0
    log = rows(db_url, "SELECT steps, first_step_id, last_step_id FROM prune_log ORDER BY batch")
    # One root per batch: the original with its notice (2 steps), then the plain step.
    assert sorted(r["steps"] for r in log) == [1, 2]
    assert {(r["first_step_id"], r["last_step_id"]) for r in log if r["steps"] == 2} == {both_old}

    # Once the pending notice is settled and old, it goes, and its original with it.
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE email_steps SET status = 'accepted', closed_at = %s WHERE id = %s", (OLD, notice_pending[1])
        )
    assert (await pruner(store, batch=1).run_once()).steps == 2
    assert {r["id"] for r in rows(db_url, "SELECT id FROM steps_now")} == set(notice_recent)


async def test_the_cutoff_is_the_databases_clock_and_a_future_cutoff_is_refused(store, db_url):
    """A client whose clock runs a year ahead: the database's now() decides what is old."""
    fresh = await settled(store, Accepted("pm"), at=db_now(db_url) - timedelta(seconds=12))
    cutoff = await store.prune_cutoff(older_than=timedelta(days=1))
    assert abs(cutoff - (db_now(db_url) - timedelta(days=1))) < timedelta(minutes=5)
    # A cutoff computed on a clock a year ahead is refused by the function itself.
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        await store.prune_batch(
            cutoff=db_now(db_url) + timedelta(days=364),
            limit=10,
            actor="a",
            run="00000000-0000-0000-0000-000000000000",
            batch=1,
        )
    assert await pruner(store).run_once() == PruneCounts()
    assert rows(db_url, "SELECT id FROM steps_now") == [{"id": fresh}]


async def test_old_refusals_are_pruned_with_the_same_cutoff_and_their_counts_stay(store, db_url):
    from evq.worker.refusals import describe

    def refused(at: datetime):
        return store.record_refusal(
            describe("cli", [{"run_id": "r"}], [{"field": "to", "message": "required"}], key_name=None), now=at
        )

    for _ in range(3):
        await refused(OLD)
    await refused(NOW - timedelta(days=1))
    counted = await pruner(store, dry_run=True).run_once()
    assert counted.refusals == 3 and count(db_url, "SELECT count(*) AS n FROM enqueue_refusals") == 4
    done = await pruner(store).run_once()  # batch 2: two statements, then an empty one
    assert done.refusals == 3 and done.steps == 0
    assert count(db_url, "SELECT count(*) AS n FROM enqueue_refusals") == 1
    assert rows(db_url, "SELECT total FROM enqueue_refusal_counts") == [{"total": 4}]


async def test_budget_counters_go_a_batch_at_a_time_and_an_interrupt_stops_between_batches(store, db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO send_budgets (budget, scope, window_start, used, updated_at) "
            "SELECT 'domain_hourly', 'd' || g || '.example', date_trunc('hour', now() - interval '100 days'), 1, "
            "       now() - interval '100 days' FROM generate_series(1, 5) g"
        )
    progress: list[PruneCounts] = []
    first = Pruner(
        store,
        PrunerConfig(older_than=timedelta(days=90), batch=2),
        actor="test-admin",
        progress=progress.append,
        should_stop=lambda: bool(progress) and progress[-1].budgets > 0,
    )
    counts = await first.run_once()
    assert first.stopped and counts.budgets == 2 and [p.budgets for p in progress] == [2]
    assert count(db_url, "SELECT count(*) AS n FROM send_budgets") == 3
    # The same command again finds the rest.
    assert (await pruner(store).run_once()).budgets == 3
    assert count(db_url, "SELECT count(*) AS n FROM send_budgets") == 0


async def test_a_day_is_24_hours_whatever_the_databases_time_zone(db_url):
    """On the day the clocks go forward a calendar day in New York is 23 hours: the UTC day's
    counter must not go an hour before that day ends."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET timezone = 'America/New_York'")
    policy = ApprovalPolicy(budgets=((Budget.KEY_DAILY, 1),))
    store = await PostgresStore.open(db_url, max_size=2)
    try:
        first = await store.enqueue(
            valid(run_id="d", step_id="1"), now=datetime(2026, 3, 8, 12, tzinfo=UTC), approval=policy
        )
        part = await store.prune_budgets(cutoff=datetime(2026, 3, 8, 23, 30, tzinfo=UTC), limit=100, after=None)
        again = await store.enqueue(
            valid(run_id="d", step_id="2"), now=datetime(2026, 3, 8, 23, 50, tzinfo=UTC), approval=policy
        )
    finally:
        await store.close()
    assert (first.status, part.budgets, again.status) == (Status.PENDING, 0, Status.HELD)


@pytest.mark.parametrize("charged_at", ["the database's clock", "the counter's own old time"])
async def test_a_counter_an_open_enqueue_charges_is_kept_by_a_prune_waiting_for_it(store, db_url, charged_at):
    """A run whose old steps are gone, its counter last charged long ago: an enqueue for it
    charges the counter and holds its lock while the prune's delete waits; when it commits,
    the run has a step and the counter stays, whatever `now` the enqueue passed."""
    old = datetime(2020, 1, 1, tzinfo=UTC)
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO send_budgets (budget, scope, window_start, used, updated_at) "
            "VALUES ('run_recipients', 'R', 'epoch', 1, %s)",
            (old,),
        )
    policy = ApprovalPolicy(budgets=((Budget.RUN_RECIPIENTS, 2),))
    charged, release = asyncio.Event(), asyncio.Event()

    async def enqueue():
        async with store.transaction("enqueue"):
            made = await store.enqueue(
                valid(run_id="R", step_id="new"),
                now=None if charged_at.startswith("the database") else old,
                approval=policy,
            )
            charged.set()
            await release.wait()
        return made

    enqueuing = asyncio.create_task(enqueue())
    await charged.wait()
    pruning = asyncio.create_task(store.prune_budgets(cutoff=old + timedelta(days=365), limit=100, after=None))
    await asyncio.sleep(0.5)
    assert not pruning.done(), "the delete did not wait for the enqueue's row lock"
    release.set()
    made, part = await enqueuing, await pruning
    assert (made.status, part.budgets) == (Status.PENDING, 0)
    assert rows(db_url, "SELECT used FROM send_budgets WHERE scope = 'R'") == [{"used": 2}]
