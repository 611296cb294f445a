"""Evidence partitioned by its step's id (migrations/baseline/partitions.sql) against a real database: retention
drops a partition whole only when every step of its range closed before the cutoff, a
sealed partition refuses new history, the overflow keeps what no partition covers, and
nothing open, recent or unknown loses a row.

Each test moves the step sequence past the partitions the migration made and asks for
partitions of ten step ids, so a handful of steps spans several of them."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import psycopg
import pytest

from evq.worker.config import EVIDENCE_PARTITION_STEPS_MOST
from evq.worker.outcomes import Accepted, Rejected, Unknown
from evq.worker.partitions import PartitionKeeper
from tests.integration.test_prune import NOW, OLD, RECENT, pruner, settled
from tests.support import rows, valid

BASE = 5_000_000  # the migration's partitions end here (four of a million ahead of an empty table)
SIZE = 10
CUTOFF = "now() - interval '90 days'"


def small_partitions(url: str) -> None:
    """Step ids from BASE + 1 on, in partitions of SIZE ids: [BASE, BASE+10), [BASE+10, BASE+20)..."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT setval(pg_get_serial_sequence('email_steps', 'id'), %s)", (BASE,))
        conn.execute("SELECT evq_evidence_partitions_ahead(%s)", (SIZE,))


def ahead(url: str) -> None:
    rows(url, "SELECT evq_evidence_partitions_ahead(%s) AS made", (SIZE,))


def partitions(url: str) -> dict[str, dict]:
    return {p["name"]: p for p in rows(url, "SELECT * FROM evq_evidence_partitions()")}


def evidence_of(url: str, ids: list[int]) -> int:
    return rows(url, "SELECT count(*) AS n FROM evidence WHERE step_id = ANY(%s)", (ids,))[0]["n"]


async def fill(store, url: str, outcome, *, at, count: int) -> list[int]:
    made = [await settled(store, outcome, at=at) for _ in range(count)]
    ahead(url)  # as the worker's keeper does every minute
    return made


async def test_a_partition_whose_steps_all_closed_before_the_cutoff_goes_whole_and_the_rest_by_rows(store, db_url):
    small_partitions(db_url)
    first = await fill(store, db_url, Accepted("pm"), at=OLD, count=9)  # [BASE, BASE+10): ids BASE+1..BASE+9
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    unknown = await fill(store, db_url, Unknown("reset after the dot"), at=OLD, count=1)  # BASE+19: holds the second
    recent = await fill(store, db_url, Accepted("pm"), at=RECENT, count=10)
    assert first == list(range(BASE + 1, BASE + 10)) and unknown == [BASE + 19]
    kept_before = {i: evidence_of(db_url, [i]) for i in unknown + recent}
    total_before = rows(db_url, "SELECT count(*) AS n FROM evidence")[0]["n"]
    # The migration's partitions below BASE hold no step: empty, and older than every step.
    empty = {p for p, part in partitions(db_url).items() if part["hi"] <= BASE}
    assert len(empty) == 5

    counts = await pruner(store, batch=100).run_once()

    names = partitions(db_url)
    assert not empty & set(names) and f"evidence_steps_{BASE}" not in names
    assert {f"evidence_steps_{BASE + 10}", f"evidence_steps_{BASE + 20}"} <= set(names)
    assert not any(p["sealed"] for p in names.values())
    dropped = rows(db_url, "SELECT * FROM prune_log WHERE evidence_partition IS NOT NULL ORDER BY first_step_id")
    oldest_first = sorted(empty, key=lambda n: int(n.rsplit("_", 1)[1]))
    assert [d["evidence_partition"] for d in dropped] == [*oldest_first, f"evidence_steps_{BASE}"]
    assert all(d["evidence"] == 0 for d in dropped[:-1])
    log = dropped[-1]
    assert (log["evidence_partition"], log["first_step_id"], log["last_step_id"]) == (
        f"evidence_steps_{BASE}",
        BASE,
        BASE + SIZE - 1,
    )
    assert (log["steps"], log["evidence"], log["decisions"]) == (0, 2 * 9, 0)
    # The first partition's steps and decisions went by the batches with nothing left to delete;
    # the second partition's closed steps went row by row, its unknown one stayed.
    assert counts.partitions == 6
    assert (counts.steps, counts.evidence, counts.decisions) == (18, 36, 18)
    left = rows(db_url, "SELECT id FROM steps_now ORDER BY id")
    assert [r["id"] for r in left] == unknown + recent
    assert {i: evidence_of(db_url, [i]) for i in unknown + recent} == kept_before
    assert rows(db_url, "SELECT count(*) AS n FROM evidence")[0]["n"] == total_before - 36
    logged = rows(db_url, "SELECT sum(steps) AS s, sum(evidence) AS e, sum(decisions) AS d FROM prune_log")[0]
    assert (logged["s"], logged["e"], logged["d"]) == (18, 36, 18)


async def test_the_newest_partition_and_one_closed_after_the_cutoff_are_never_sealed(store, db_url):
    small_partitions(db_url)
    late = await fill(store, db_url, Rejected("550 no"), at=OLD, count=9)  # closed old, then...
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)  # the last partition with steps: none above it
    # ...one of the first partition's steps closed again recently (an answer written late):
    # its evidence since the cutoff keeps the whole range.
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor, created_at) "
            "SELECT id, run_id, 'delivery_event', 'webhook', %s FROM steps_now WHERE id = %s",
            (NOW - timedelta(days=1), late[0]),
        )
    before = rows(db_url, "SELECT count(*) AS n FROM evidence")[0]["n"]
    assert rows(db_url, f"SELECT * FROM evq_evidence_seal({CUTOFF}, %s)", (BASE - 1,)) == []
    assert not any(p["sealed"] for p in partitions(db_url).values())
    assert rows(db_url, "SELECT count(*) AS n FROM evidence")[0]["n"] == before


async def test_a_sealed_partition_refuses_new_history_and_the_next_prune_finishes_it(store, db_url):
    small_partitions(db_url)
    first = await fill(store, db_url, Rejected("550 no"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    [sealed] = rows(db_url, f"SELECT * FROM evq_evidence_seal({CUTOFF}, %s)", (BASE - 1,))
    assert sealed["partition_name"] == f"evidence_steps_{BASE}"
    assert partitions(db_url)[f"evidence_steps_{BASE}"]["sealed"]
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.ObjectInUse, match="evq prune is removing"):
        conn.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor) SELECT id, run_id, 'delivery_event', 'webhook' "
            "FROM email_steps WHERE id = %s",
            (first[0],),
        )
    assert evidence_of(db_url, first) == 2 * 9
    # The run that sealed it stopped there (killed between its two transactions): the next
    # run takes the sealed partition first.
    counts = await pruner(store, batch=100).run_once()
    assert counts.partitions == 6 and f"evidence_steps_{BASE}" not in partitions(db_url)
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now WHERE id = ANY(%s)", (first,))[0]["n"] == 0


async def test_a_step_found_open_after_the_seal_gives_the_partition_back_untouched(store, db_url):
    small_partitions(db_url)
    first = await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    rows(db_url, f"SELECT * FROM evq_evidence_seal({CUTOFF}, %s)", (BASE - 1,))
    # What no evq path can do while sealed (every change of a step writes evidence): a step
    # of the range closed recently, written with the triggers off by the owner.
    with psycopg.connect(db_url) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE email_steps SET closed_at = now() WHERE id = %s", (first[4],))
    [result] = rows(
        db_url,
        f"SELECT * FROM evq_evidence_drop(%s, {CUTOFF}, 'test', gen_random_uuid(), 1)",
        (f"evidence_steps_{BASE}",),
    )
    assert result["dropped"] is False
    part = partitions(db_url)[f"evidence_steps_{BASE}"]
    assert not part["sealed"]
    assert evidence_of(db_url, first) == 2 * 9
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log")[0]["n"] == 0


async def test_evidence_no_partition_covers_waits_in_the_overflow_and_the_next_partition_starts_above_it(store, db_url):
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT setval(pg_get_serial_sequence('email_steps', 'id'), %s)", (9_000_000,))
    # Past every partition (the keeper has not run): nothing refused, nothing lost.
    spilled = [await settled(store, Accepted("pm"), at=OLD) for _ in range(3)]
    assert rows(db_url, "SELECT count(*) AS n FROM evidence_overflow")[0]["n"] == 6
    assert evidence_of(db_url, spilled) == 6
    keeper = PartitionKeeper(store, steps=SIZE)
    assert (await keeper.run_once()).made >= 1
    assert (await keeper.run_once()).made == 0  # four ahead already: the other workers find nothing to do
    above = min(p["lo"] for p in partitions(db_url).values() if p["lo"] >= 9_000_000)
    assert above == max(spilled) + 1
    later = await settled(store, Accepted("pm"), at=OLD)
    assert rows(db_url, "SELECT tableoid::regclass::text AS t FROM evidence WHERE step_id = %s", (later,))[0]["t"] == (
        f"evidence_steps_{above}"
    )


async def test_history_for_a_dropped_range_is_refused_not_kept_alone(store, db_url):
    small_partitions(db_url)
    first = await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    counts = await pruner(store, batch=100).run_once()
    assert counts.partitions == 6
    with (
        psycopg.connect(db_url) as conn,
        pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="removed the history"),
    ):
        conn.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor) VALUES (%s, 'r', 'delivery_event', 'webhook')",
            (first[0],),
        )


async def test_a_partition_is_append_only_like_evidence(store, db_url):
    small_partitions(db_url)
    first = await fill(store, db_url, Accepted("pm"), at=OLD, count=3)
    part = f"evidence_steps_{BASE}"
    for sql in (
        f"UPDATE {part} SET actor = 'x'",
        f"DELETE FROM {part}",
        f"TRUNCATE {part}",
        "TRUNCATE evidence_overflow",
    ):
        with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
            conn.execute(sql)
    assert evidence_of(db_url, first) == 6


async def test_a_writer_holding_the_partition_keeps_it_from_being_sealed(store, db_url):
    small_partitions(db_url)
    first = await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    # A transaction still writing history into the range (a late delivery event, say): the
    # seal waits for it only a moment, then leaves the partition to a later run.
    with psycopg.connect(db_url) as writer:
        writer.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor, created_at) "
            "SELECT id, run_id, 'delivery_event', 'webhook', %s FROM steps_now WHERE id = %s",
            (OLD, first[0]),
        )
        assert rows(db_url, f"SELECT * FROM evq_evidence_seal({CUTOFF}, %s)", (BASE - 1,)) == []
        writer.commit()
    assert not partitions(db_url)[f"evidence_steps_{BASE}"]["sealed"]
    assert evidence_of(db_url, first) == 2 * 9 + 1


def _behind(db_url: str, hold, sql: str, params: tuple, meanwhile=lambda holder: None) -> list[object]:
    """Run ``sql`` while another session holds what it needs: ``hold(holder)`` takes it (a
    lock, an uncommitted insert), and once ``sql`` waits for its lock, ``meanwhile(holder)``
    runs in the holder's transaction, which then commits and lets ``sql`` go on. What ``sql``
    returned (or raised)."""
    outcome: list[object] = []
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as waiter:
        hold(holder)
        pid = waiter.info.backend_pid

        def run() -> None:
            try:
                outcome.append(waiter.execute(sql, params).fetchall())
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        waiting = False
        for _ in range(600):  # until it waits for its lock (a condition, not a delay)
            got = rows(db_url, "SELECT wait_event_type AS w FROM pg_stat_activity WHERE pid = %s", (pid,))
            if got and got[0]["w"] == "Lock":
                waiting = True
                break
            threading.Event().wait(0.05)
        assert waiting
        meanwhile(holder)
        holder.commit()
        thread.join()
    return outcome


DROP = f"SELECT * FROM evq_evidence_drop(%s, {CUTOFF}, 'test', gen_random_uuid(), 1)"
SEAL = f"SELECT * FROM evq_evidence_seal({CUTOFF}, %s)"


def _drop_behind(db_url: str, part: str, meanwhile) -> list[object]:
    """evq_evidence_drop of ``part`` while another session holds the partition."""

    def hold(holder: psycopg.Connection) -> None:
        holder.execute(f"LOCK TABLE {part} IN ACCESS EXCLUSIVE MODE")

    return _behind(db_url, hold, DROP, (part,), meanwhile)


async def _first_sealed(store, db_url: str, outcome) -> tuple[list[int], str]:
    """Two partitions of closed steps (the first's closed with ``outcome``), the first sealed."""
    small_partitions(db_url)
    first = await fill(store, db_url, outcome, at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    part = f"evidence_steps_{BASE}"
    rows(db_url, f"SELECT * FROM evq_evidence_seal({CUTOFF}, %s)", (BASE - 1,))
    return first, part


async def test_a_seal_taken_away_while_the_drop_checks_keeps_the_partition(store, db_url):
    """The drop checks the range, then counts the rows, then drops the table: if the seal can
    go in between (the give-back of another evq prune whose drop timed out, or the runtime
    role calling evq_evidence_unseal), a step reopened there loses its history. Here a
    session holding the partition pauses the drop before its checks; meanwhile the seal goes
    and a step of the range is requeued with its evidence. The drop says "not dropped"
    (an earlier version failed on removing the seal that was gone)."""
    first, part = await _first_sealed(store, db_url, Rejected("550 no"))

    def reopen(holder: psycopg.Connection) -> None:
        holder.execute("SELECT evq_evidence_unseal(%s)", (part,))
        holder.execute(
            "UPDATE email_steps SET status = 'retryable', closed_at = NULL, next_attempt_at = now() WHERE id = %s",
            (first[0],),
        )
        holder.execute(
            "INSERT INTO step_queue (id, provider) SELECT id, provider FROM email_steps WHERE id = %s", (first[0],)
        )
        holder.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor, from_status, to_status) "
            "SELECT id, run_id, 'operator_resolved', 'operator', 'rejected', 'retryable' FROM steps_now WHERE id = %s",
            (first[0],),
        )

    outcome = _drop_behind(db_url, part, reopen)
    assert outcome == [[(False, 0, BASE, BASE + SIZE)]], outcome
    assert rows(db_url, "SELECT status FROM steps_now WHERE id = %s", (first[0],))[0]["status"] == "retryable"
    assert part in partitions(db_url), outcome
    assert evidence_of(db_url, [first[0]]) == 3


async def test_history_added_after_a_give_back_the_drop_waited_through_is_kept(store, db_url):
    """The same wait, but no step reopens: the seal goes and a closed step gets one more row
    of history (a late delivery event). Every step is still closed before the cutoff, so only
    the seal, read after the drop holds the partition, tells the drop to leave it (an earlier version read
    it before waiting, saw it sealed, and dropped the partition with that row)."""
    first, part = await _first_sealed(store, db_url, Accepted("pm"))

    def late_event(holder: psycopg.Connection) -> None:
        holder.execute("SELECT evq_evidence_unseal(%s)", (part,))
        holder.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor) SELECT id, run_id, 'delivery_event', 'webhook' "
            "FROM email_steps WHERE id = %s",
            (first[0],),
        )

    outcome = _drop_behind(db_url, part, late_event)
    assert outcome == [[(False, 0, BASE, BASE + SIZE)]], outcome
    assert part in partitions(db_url) and not partitions(db_url)[part]["sealed"]
    assert evidence_of(db_url, [first[0]]) == 3
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log WHERE evidence_partition = %s", (part,))[0]["n"] == 0


async def test_two_drops_of_one_partition_drop_it_once_and_the_second_says_not_dropped(store, db_url):
    """Two evq prune runs at once take the same sealed partition (a sealed one comes first):
    the second drop waits for the first, then finds the partition gone."""
    _, part = await _first_sealed(store, db_url, Accepted("pm"))

    def first_drop(holder: psycopg.Connection) -> None:
        [done] = holder.execute(
            f"SELECT * FROM evq_evidence_drop(%s, {CUTOFF}, 'test', gen_random_uuid(), 1)", (part,)
        ).fetchall()
        assert done == (True, 18, BASE, BASE + SIZE)

    outcome = _drop_behind(db_url, part, first_drop)
    assert outcome == [[(False, 0, None, None)]], outcome
    assert part not in partitions(db_url)
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log WHERE evidence_partition = %s", (part,))[0]["n"] == 1


async def test_a_drop_after_another_run_dropped_the_partition_says_not_dropped(store, db_url):
    """A run that read the partition's name before another run dropped it: "not dropped",
    not an error that stops evq prune (an earlier version checked the name against the
    catalog before its lock, and raised 'not an evidence partition')."""
    _, part = await _first_sealed(store, db_url, Accepted("pm"))
    assert rows(db_url, DROP, (part,))[0]["dropped"] is True
    assert rows(db_url, DROP, (part,)) == [{"dropped": False, "rows_dropped": 0, "range_lo": None, "range_hi": None}]
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log WHERE evidence_partition = %s", (part,))[0]["n"] == 1


async def test_two_drops_behind_a_reader_time_out_and_neither_deadlocks(store, db_url):
    """Two evq prune runs drop the same sealed partition while a reader holds it (pg_dump, a
    report). Each drop's lock lets the reader by, and DROP TABLE then waits for it: when both
    held ACCESS SHARE, each waited for the other's and PostgreSQL killed one as a deadlock,
    an error evq prune does not expect. Now the second waits for the first, and both give up
    after their lock timeout, as one drop alone does; everything stays."""
    first, part = await _first_sealed(store, db_url, Accepted("pm"))
    outcomes: list[object] = []

    def drop() -> None:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                outcomes.append(conn.execute(DROP, (part,)).fetchall())
        except psycopg.Error as exc:
            outcomes.append(exc)

    with psycopg.connect(db_url) as reader:
        reader.execute(f"SELECT count(*) FROM {part}")
        drops = [threading.Thread(target=drop) for _ in range(2)]
        for thread in drops:
            thread.start()
        for thread in drops:
            thread.join()
        reader.commit()
    assert [type(o) for o in outcomes] == [psycopg.errors.LockNotAvailable] * 2, outcomes
    assert partitions(db_url)[part]["sealed"] and evidence_of(db_url, first) == 2 * 9


async def test_a_give_back_of_a_partition_no_longer_sealed_says_so(store, db_url):
    small_partitions(db_url)
    part = f"evidence_steps_{BASE}"
    assert rows(db_url, "SELECT evq_evidence_unseal(%s) AS u", (part,)) == [{"u": False}]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not an evidence partition"):
        rows(db_url, f"SELECT * FROM evq_evidence_drop('email_steps', {CUTOFF}, 'test', gen_random_uuid(), 1)")


async def test_a_late_row_whose_writer_committed_while_the_seal_waited_is_kept(store, db_url):
    """The seal looks for rows written since the cutoff, then its trigger waits for the
    partition's writers. A late delivery event still uncommitted at the look is not seen, and
    is sealed in when its writer commits. The drop counts the partition under its lock with
    its newest row's time, finds that row and gives the partition back, as the seal's own rule
    says (an earlier version dropped the partition, that row with it). Its steps then go by
    the batches, each by the steps' rule."""
    small_partitions(db_url)
    first = await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    part = f"evidence_steps_{BASE}"

    def late_event(holder: psycopg.Connection) -> None:
        holder.execute(
            "INSERT INTO evidence (step_id, run_id, kind, actor) SELECT id, run_id, 'delivery_event', 'webhook' "
            "FROM email_steps WHERE id = %s",
            (first[0],),
        )

    sealed = _behind(db_url, late_event, SEAL, (BASE - 1,))
    assert sealed == [[(part, BASE, BASE + SIZE)]], sealed
    assert rows(db_url, DROP, (part,)) == [
        {"dropped": False, "rows_dropped": 0, "range_lo": BASE, "range_hi": BASE + SIZE}
    ]
    assert part in partitions(db_url) and not partitions(db_url)[part]["sealed"]
    assert evidence_of(db_url, first) == 2 * 9 + 1
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log WHERE evidence_partition = %s", (part,))[0]["n"] == 0


@pytest.mark.parametrize("level", ["REPEATABLE READ", "SERIALIZABLE"])
async def test_the_seal_and_the_drop_refuse_to_run_under_one_snapshot(store, db_url, level):
    """Under REPEATABLE READ or SERIALIZABLE the whole call reads the snapshot of its first
    statement, taken before it waits for the partition: a give-back and a late row committed
    meanwhile went unseen, and the drop took them (an operator's default_transaction_isolation
    is enough). Both refuse, and leave everything as it was."""
    _, part = await _first_sealed(store, db_url, Accepted("pm"))
    for sql, params in ((DROP, (part,)), (SEAL, (BASE - 1,))):
        with psycopg.connect(db_url) as conn:
            conn.execute(f"SET TRANSACTION ISOLATION LEVEL {level}")
            with pytest.raises(psycopg.errors.InvalidTransactionState, match="only under READ COMMITTED"):
                conn.execute(sql, params)
    assert partitions(db_url)[part]["sealed"]
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log WHERE evidence_partition IS NOT NULL")[0]["n"] == 0


async def test_a_store_refuses_a_database_whose_transactions_start_under_one_snapshot(db_url):
    """The same setting refuses evq at start, with the remedy, before any work."""
    from evq.adapters.postgres.store import PostgresStore
    from evq.worker.errors import ConfigError

    name = rows(db_url, "SELECT current_database() AS d")[0]["d"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'")
    with pytest.raises(ConfigError, match=r"start REPEATABLE READ \(set by the database") as refused:
        await PostgresStore.open(db_url, max_size=2)
    assert "IN DATABASE" in (refused.value.hint or "")
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'read uncommitted'")
    store = await PostgresStore.open(db_url, max_size=2)  # PostgreSQL's READ UNCOMMITTED is READ COMMITTED
    await store.close()


@pytest.mark.parametrize("size", [0, EVIDENCE_PARTITION_STEPS_MOST + 1])
async def test_a_partition_size_past_the_bounds_is_refused(db_url, size):
    """One partition of every future step id would end whole-partition retention for good;
    the setting's bound is the database's."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="from 1 to 1000000000 step ids"):
        rows(db_url, "SELECT evq_evidence_partitions_ahead(%s)", (size,))
    assert rows(db_url, "SELECT evq_evidence_partitions_ahead(%s) AS n", (EVIDENCE_PARTITION_STEPS_MOST,))[0]["n"] > 0


async def test_a_new_step_whose_id_falls_in_a_dropped_range_keeps_its_history(store, db_url):
    """The overflow refuses history for a range retention dropped, by step id alone. Once the
    batches have taken that range's steps, an id there is free again: a restore that resets
    the step sequence (setval to max(id) + 1 with the old steps pruned, a logical copy that
    does not carry sequences) hands it to a new step. That step did not exist when the range
    went, so it lost nothing, and refusing its evidence refuses its claim: it is never sent,
    and every claim batch it falls in fails."""
    small_partitions(db_url)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    counts = await pruner(store, batch=100).run_once()
    assert counts.partitions == 6
    dropped = rows(db_url, "SELECT first_step_id, last_step_id FROM prune_log WHERE evidence_partition IS NOT NULL")
    assert any(d["first_step_id"] <= 101 <= d["last_step_id"] for d in dropped)
    with psycopg.connect(db_url) as conn:
        conn.execute("SELECT setval(pg_get_serial_sequence('email_steps', 'id'), 100)")
    step = await store.enqueue(valid())  # the database's clock, as in production
    assert step.id == 101
    [claimed] = await store.claim(owner="w", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={})
    assert claimed.id == 101
    assert evidence_of(db_url, [101]) == 1


async def test_a_long_reader_of_evidence_neither_hangs_prune_nor_stalls_writers_once_per_partition(store, db_url):
    """A reader holding evidence (pg_dump, a report, a session idle in a transaction) keeps
    the drop from its lock: the drop gives up after its timeout, but each try first queues
    for evidence's exclusive lock, and every writer of evidence queues behind it. So one try
    a run, not one per partition; and giving the partition back must not wait for the reader
    either (an unseal queued for the partition's lock holds every reader behind it, and the
    run with it, until the reader ends)."""
    small_partitions(db_url)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    await fill(store, db_url, Accepted("pm"), at=OLD, count=9)
    tries: list[object] = []
    prune_partition = store.prune_partition

    async def counted(**kw):
        part = await prune_partition(**kw)
        tries.append(part)
        return part

    store.prune_partition = counted
    with psycopg.connect(db_url) as reader:
        reader.execute("SELECT count(*) FROM evidence")
        # A bound so the test ends if the run hangs, not a measurement.
        counts = await asyncio.wait_for(pruner(store, batch=100).run_once(), timeout=60)
        assert counts.partitions == 0
        assert len([p for p in tries if p is not None and not p.dropped]) == 1
        # The batches took the steps meanwhile, row by row.
        assert counts.steps == 18
        reader.commit()
    again = await pruner(store, batch=100).run_once()
    assert again.partitions >= 1
    assert not any(p["sealed"] for p in partitions(db_url).values())
