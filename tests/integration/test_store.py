"""The PostgreSQL store against a real database: every transition, its guard, and its evidence."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg.rows import dict_row

from evq.adapters.postgres.store import PostgresStore
from evq.worker.backoff import Backoff
from evq.worker.errors import IdempotencyConflict
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.ports import StepFilter
from evq.worker.states import Status
from evq.worker.transitions import decide
from tests.support import evidence_kinds, rows, step_row, valid

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LEASE = 60.0


async def claim(store: PostgresStore, *, owner: str = "w1", limit: int = 10, now=T0, windows=None):
    return await store.claim(
        owner=owner, providers=["smtp"], limit=limit, lease_seconds=LEASE, dedupe_windows=windows or {}, now=now
    )


def settle(step, outcome, *, window_open=False):
    return decide(step, outcome, default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=window_open)


async def test_enqueue_is_idempotent_and_conflicts_write_nothing(store: PostgresStore, db_url: str):
    req = valid(step_id="a")
    first = await store.enqueue(req, now=T0)
    again = await store.enqueue(req, now=T0)
    assert first.created and not again.created
    assert again.id == first.id and again.message_id == first.message_id
    changed = valid(step_id="a", text="a different body")
    with pytest.raises(IdempotencyConflict) as err:
        await store.enqueue(changed, now=T0)
    assert err.value.code == "E_CONFLICT"
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 1
    # No orphan decision from the repeat or the refused conflicting request.
    assert rows(db_url, "SELECT count(*) AS n FROM decisions")[0]["n"] == 1


async def test_concurrent_enqueues_of_one_key_make_one_step(store: PostgresStore, db_url: str):
    req = valid(step_id="race")
    results = await asyncio.gather(*(store.enqueue(req) for _ in range(8)))
    assert len({r.id for r in results}) == 1
    assert sum(r.created for r in results) == 1
    assert rows(db_url, "SELECT count(*) AS n FROM decisions")[0]["n"] == 1


async def test_claim_commits_attempt_and_evidence_before_returning(store: PostgresStore, db_url: str):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    assert step.id == e.id and step.attempt == 1 and step.message_id == e.message_id
    row = step_row(db_url, e.id)  # read from another connection: committed
    assert row["status"] == "in_flight" and row["attempts"] == 1
    assert row["lease_token"] == step.lease_token and row["lease_owner"] == "w1"
    assert row["lease_expires_at"] == T0 + timedelta(seconds=LEASE)
    assert evidence_kinds(db_url, e.id) == ["attempt_started"]
    assert await claim(store) == []  # nothing left to claim


async def test_claim_skips_future_and_other_providers(store: PostgresStore):
    await store.enqueue(valid(provider="null"), now=T0)
    assert await claim(store) == []
    assert not await store.claimable_exists(providers=["smtp"], lease_seconds=LEASE, now=T0)
    assert await store.claimable_exists(providers=["null"], lease_seconds=LEASE, now=T0)


async def test_concurrent_claims_never_share_a_row(store: PostgresStore, db_url: str):
    for _ in range(60):
        await store.enqueue(valid(), now=T0)
    batches = await asyncio.gather(*(claim(store, owner=f"w{i}", limit=7) for i in range(4)))
    claimed = [s.id for b in batches for s in b]
    assert len(claimed) == len(set(claimed)) == 28


@pytest.mark.parametrize(
    ("outcome", "status", "closed"),
    [
        (Accepted("queue-1"), "accepted", True),
        (Rejected("550 no such user"), "rejected", True),
        (Unknown("reply lost"), "unknown", False),
        (Retryable("451 try later"), "retryable", False),
    ],
)
async def test_record_applies_each_outcome_with_evidence(store, db_url, outcome, status, closed):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    [result] = await store.record([settle(step, outcome)], actor="w1", now=T0 + timedelta(seconds=1))
    assert result.applied
    row = step_row(db_url, e.id)
    assert row["status"] == status
    assert (row["closed_at"] is not None) == closed
    assert row["lease_token"] is None
    assert (row["unknown_since"] is not None) == (status == "unknown")
    ev = rows(db_url, "SELECT * FROM evidence WHERE step_id = %s ORDER BY id", (e.id,))
    assert [r["kind"] for r in ev] == ["attempt_started", "provider_response"]
    assert ev[1]["outcome"] == outcome.kind and ev[1]["to_status"] == status
    if status == "accepted":
        assert row["provider_message_id"] == "queue-1"
    if status == "retryable":
        assert row["next_attempt_at"] == T0 + timedelta(seconds=1) + timedelta(seconds=1)


async def test_retryable_exhausts_into_rejected(store, db_url):
    e = await store.enqueue(valid(max_attempts=2), now=T0)
    t = T0
    for _ in range(2):
        [step] = await claim(store, now=t)
        await store.record([settle(step, Retryable("451"))], actor="w1", now=t)
        t += timedelta(hours=1)
    row = step_row(db_url, e.id)
    assert row["status"] == "rejected" and row["reason"] == "attempts_exhausted" and row["attempts"] == 2
    assert await claim(store, now=t) == []


async def test_recording_twice_is_a_no_op(store, db_url):
    """A commit retried after its acknowledgement was lost must not add a second answer."""
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    t = settle(step, Accepted("q"))
    await store.record([t], actor="w1")
    [again] = await store.record([t], actor="w1")
    assert not again.applied and again.duplicate and not again.settled
    assert evidence_kinds(db_url, e.id) == ["attempt_started", "provider_response"]


async def test_zombie_answer_is_fenced_and_kept(store, db_url):
    """A worker whose lease expired answers after another worker took the row."""
    e = await store.enqueue(valid(), now=T0)
    [zombie] = await claim(store, owner="zombie")
    later = T0 + timedelta(seconds=LEASE + 1)
    # The row is rescued under a dedupe window, so it may retry, and another worker claims it.
    await rows_exec(db_url, "UPDATE step_queue SET dedupe_until = %s WHERE id = %s", (T0 + timedelta(days=1), e.id))
    counts = await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor="r", now=later)
    assert counts.retryable == 1
    [fresh] = await claim(store, owner="w2", now=later)
    assert fresh.attempt == 2
    [late] = await store.record([settle(zombie, Accepted("zombie-id"))], actor="zombie", now=later)
    assert not late.applied and not late.settled and not late.duplicate
    row = step_row(db_url, e.id)
    assert row["status"] == "in_flight" and row["lease_owner"] == "w2" and row["provider_message_id"] is None
    late_rows = rows(db_url, "SELECT * FROM evidence WHERE kind = 'late_response' AND step_id = %s", (e.id,))
    assert len(late_rows) == 1 and late_rows[0]["to_status"] is None and late_rows[0]["outcome"] == "accepted"
    assert late_rows[0]["detail"]["fenced"] is True


async def test_definite_late_answer_settles_a_rescued_unknown_row(store, db_url):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    later = T0 + timedelta(seconds=LEASE + 1)
    counts = await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor="r", now=later)
    assert counts.unknown == 1
    assert step_row(db_url, e.id)["status"] == "unknown"
    [late] = await store.record([settle(step, Accepted("q-9"))], actor="w1", now=later)
    assert late.settled and not late.applied
    row = step_row(db_url, e.id)
    assert row["status"] == "accepted" and row["reason"] == "late_answer" and row["provider_message_id"] == "q-9"
    assert evidence_kinds(db_url, e.id) == ["attempt_started", "lease_expired", "late_response"]


async def test_ambiguous_late_answer_does_not_settle(store, db_url):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    later = T0 + timedelta(seconds=LEASE + 1)
    await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor="r", now=later)
    [late] = await store.record([settle(step, Unknown("reset"))], actor="w1", now=later)
    assert not late.settled
    assert step_row(db_url, e.id)["status"] == "unknown"


async def test_rescue_makes_expired_leases_unknown_once(store, db_url):
    ids = [(await store.enqueue(valid(), now=T0)).id for _ in range(3)]
    await claim(store)
    assert (await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor="r", now=T0)).total == 0
    later = T0 + timedelta(seconds=LEASE + 1)
    results = await asyncio.gather(
        *(
            store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor=f"r{i}", now=later)
            for i in range(3)
        )
    )
    assert sum(r.unknown for r in results) == 3
    for i in ids:
        row = step_row(db_url, i)
        assert row["status"] == "unknown" and row["reason"] == "lease_expired" and row["maybe_delivered"]
        assert evidence_kinds(db_url, i) == ["attempt_started", "lease_expired"]


async def test_rescue_retries_only_inside_the_dedupe_window(store, db_url):
    a = await store.enqueue(valid(), now=T0)
    await claim(store, windows={"smtp": 3600})
    later = T0 + timedelta(seconds=LEASE + 1)
    counts = await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor="r", now=later)
    assert counts.retryable == 1
    row = step_row(db_url, a.id)
    assert row["status"] == "retryable" and row["maybe_delivered"]
    # Once the window no longer covers a whole lease, the row may not be retried: it becomes unknown.
    closing = T0 + timedelta(seconds=3600 - LEASE + 1)
    assert await claim(store, now=closing) == []
    counts = await store.rescue(limit=10, lease_seconds=LEASE, default_max_attempts=5, actor="r", now=closing)
    assert counts.window_closed == 1
    row = step_row(db_url, a.id)
    assert row["status"] == "unknown" and row["reason"] == "dedupe_window_closed"
    assert evidence_kinds(db_url, a.id)[-1] == "window_closed"


async def test_release_hands_back_an_unsent_claim(store, db_url):
    e = await store.enqueue(valid(), now=T0)
    [step] = await claim(store)
    assert await store.release([step], actor="w1", now=T0) == 1
    row = step_row(db_url, e.id)
    assert row["status"] == "pending" and row["attempts"] == 0 and row["first_attempt_at"] is None
    assert evidence_kinds(db_url, e.id) == ["attempt_started", "attempt_released"]
    [again] = await claim(store)
    assert again.attempt == 1 and again.lease_token != step.lease_token


async def test_release_orphans_frees_claims_the_worker_never_received(store, db_url):
    a = await store.enqueue(valid(), now=T0)
    b = await store.enqueue(valid(), now=T0)
    c = await store.enqueue(valid(), now=T0)
    # A claim whose answer arrived: its rows may be at an adapter, whatever the worker holds.
    [received] = await store.claim(
        owner="me", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, claim_id="claim-answered", now=T0
    )
    # A claim whose answer was lost: the worker never saw these rows, so never sent them.
    lost = await store.claim(
        owner="me", providers=["smtp"], limit=2, lease_seconds=60, dedupe_windows={}, claim_id="claim-lost", now=T0
    )
    assert received.id == a.id and {s.id for s in lost} == {b.id, c.id}
    kept = [s for s in lost if s.id == c.id]  # a token the worker holds is never handed back
    assert await store.release_orphans(owner="me", held=[s.lease_token for s in kept], claims=["claim-lost"]) == 1
    assert step_row(db_url, a.id)["status"] == "in_flight"  # not held, but not of a lost claim
    assert step_row(db_url, b.id)["status"] == "pending"
    assert step_row(db_url, c.id)["status"] == "in_flight"
    assert await store.release_orphans(owner="someone-else", held=[], claims=["claim-answered"]) == 0
    assert await store.release_orphans(owner="me", held=[], claims=[]) == 0


async def test_list_and_show(store, db_url):
    e = await store.enqueue(valid(run_id="run-x", to=["x@example.net"]), now=T0)
    await store.enqueue(valid(run_id="run-y"), now=T0)
    found, total = await store.list_steps(StepFilter(run_id="run-x"))
    assert total == 1 and found[0].id == e.id and found[0].recipients == ["x@example.net"]
    found, total = await store.list_steps(StepFilter(recipient_domain="example.net"))
    assert [f.id for f in found] == [e.id]
    found, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,)))
    assert total == 0
    detail = await store.get_step(e.id)
    assert detail.decision["model"] == "m-1" and detail.step["payload"]["to"][0]["email"] == "x@example.net"


async def test_evidence_and_decisions_refuse_update_and_delete(store, db_url):
    e = await store.enqueue(valid(), now=T0)
    await claim(store)
    for sql in (
        "UPDATE evidence SET actor = 'forged'",
        "DELETE FROM evidence",
        "TRUNCATE evidence CASCADE",
        "UPDATE decisions SET model = 'forged'",
        "DELETE FROM decisions",
    ):
        with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
    assert evidence_kinds(db_url, e.id) == ["attempt_started"]


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE email_steps SET status = 'accepted'",  # terminal without closed_at
        "UPDATE email_steps SET status = 'in_flight'",  # in flight is the queue's lease, never a stored state
        "UPDATE step_queue SET lease_token = gen_random_uuid()",  # a lease without its owner and expiry
        "UPDATE email_steps SET status = 'unknown'",  # unknown without unknown_since
        "UPDATE email_steps SET status = 'lost'",  # not a state
        "UPDATE email_steps SET payload_sha256 = 'nope'",
        "UPDATE email_steps SET message_id = 'no-angle-brackets'",
    ],
)
async def test_check_constraints_hold_the_invariants(store, db_url, sql):
    await store.enqueue(valid(), now=T0)
    with psycopg.connect(db_url) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(sql)


def test_claim_uses_its_partial_index(db_url):
    """The claim's filter and order match ix_step_queue_claimable (a backlog of 2,000 among 20,000
    steps), and the terminal rows are never read: they have no queue row."""
    with psycopg.connect(db_url) as conn:
        conn.execute(
            """
            INSERT INTO decisions (id, run_id, step_id) SELECT g, 'r', 's' || g FROM generate_series(1, 20000) g;
            INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                                     payload_sha256, status, closed_at, attempts, first_attempt_at)
            SELECT 'r', 's' || g, g, 'k' || g, '<m' || g || '@x>', 'smtp', '{}', repeat('a', 64),
                   CASE WHEN g % 10 = 0 THEN 'pending' ELSE 'accepted' END,
                   CASE WHEN g % 10 = 0 THEN NULL ELSE now() END,
                   CASE WHEN g % 10 = 0 THEN 0 ELSE 1 END,
                   CASE WHEN g % 10 = 0 THEN NULL ELSE now() END
            FROM generate_series(1, 20000) g;
            INSERT INTO step_queue (id, provider) SELECT id, provider FROM email_steps WHERE status = 'pending';
            ANALYZE email_steps;
            ANALYZE step_queue;
            """
        )
        from evq.adapters.postgres.queries import Q

        plan = conn.execute(
            "EXPLAIN (FORMAT JSON) " + Q["step_claim"],
            {
                "now": None,
                "owner": "w",
                "providers": ["smtp"],
                "limit": 100,
                "lease_seconds": 60.0,
                "dedupe_windows": "{}",
                "claim_id": "c",
                "probe": False,
            },
        ).fetchone()[0]
        conn.rollback()
    assert "ix_step_queue_claimable" in str(plan)
    # provider_circuits holds a row per provider at most: a scan of it is the right plan.
    assert not [
        n
        for n in _plan_nodes(plan[0]["Plan"])
        if n["Node Type"] == "Seq Scan" and n.get("Relation Name") != "provider_circuits"
    ]


def _plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def _seq_scans(plan) -> list[str]:
    """The relations an EXPLAIN (FORMAT JSON) plan reads by a sequential scan."""
    nodes = [plan[0]["Plan"]] if isinstance(plan, list) else [plan]
    found = []
    while nodes:
        node = nodes.pop()
        if node.get("Node Type") == "Seq Scan":
            found.append(node["Relation Name"])
        nodes.extend(node.get("Plans", []))
    return found


def _nodes(plan) -> list[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan."""
    nodes, found = [plan[0]["Plan"]], []
    while nodes:
        node = nodes.pop()
        found.append(node)
        nodes.extend(node.get("Plans", []))
    return found


def _rows_read(plan, relation: str) -> int:
    """How many rows the scans of ``relation`` (or its index) returned, over all their loops."""
    return sum(
        n["Actual Rows"] * n["Actual Loops"]
        for n in _nodes(plan)
        if n.get("Relation Name") == relation or n.get("Index Name", "").startswith(relation)
    )


def test_a_page_of_a_big_run_reads_only_that_pages_steps_and_their_history(db_url):
    """runs show on a run of 20,000 steps (issue 29: the whole run was read and sent, 10 MB for
    5,000 steps): the page's steps are picked from the run's unique (run_id, step_id) index, only
    the page's rows are read from the table, their decisions and evidence by the page's ids
    (evidence through its primary key (step_id, id): it has no run_id index), and
    the total is counted from the index up to its cap. Never a table scan."""
    from evq.adapters.postgres.queries import Q
    from evq.worker.ports import COUNT_CAP

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            """
            INSERT INTO decisions (id, run_id, step_id)
            SELECT g, CASE WHEN g <= 20000 THEN 'big' ELSE 'r' || (g % 500) END, 's' || g
            FROM generate_series(1, 25000) g;
            INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                                     payload_sha256, status, closed_at, attempts, first_attempt_at)
            SELECT d.run_id, d.step_id, d.id, 'k' || d.id, '<m' || d.id || '@x>', 'smtp', '{}', repeat('a', 64),
                   'accepted', now(), 1, now()
            FROM decisions d;
            INSERT INTO evidence (step_id, run_id, attempt, kind, actor, lease_token)
            SELECT s.id, s.run_id, 1, k.kind, 'w', gen_random_uuid()
            FROM email_steps s, (VALUES ('attempt_started'), ('provider_response')) AS k(kind);
            """
        )
        conn.execute("VACUUM ANALYZE email_steps")
        conn.execute("VACUUM ANALYZE evidence")
        conn.execute("VACUUM ANALYZE decisions")

        def explain(name: str, params: dict) -> list:
            return conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q[name], params).fetchone()[0]

        page = {"run_id": "big", "limit": 50, "offset": 12_000}
        steps = conn.cursor(row_factory=dict_row).execute(Q["run_steps"], page).fetchall()
        plan = explain("run_steps", page)
        ids = [r["id"] for r in steps]
        decision_ids = sorted({r["decision_id"] for r in steps})
        evidence_plan = explain("evidence_for_steps", {"ids": ids})
        decisions_plan = explain("decisions_get", {"ids": decision_ids})
        counted = conn.execute(Q["run_step_count"], {"run_id": "big", "count_cap": COUNT_CAP}).fetchone()[0]
        count_plan = explain("run_step_count", {"run_id": "big", "count_cap": COUNT_CAP})
    # The page is the 50 step ids after the first 12,000 in step_id order (text order: s10000...).
    expected = sorted(f"s{g}" for g in range(1, 20001))[12_000:12_050]
    assert [r["step_id"] for r in steps] == expected
    # The skipped 12,000 are index entries only; the table gives the page's 50 rows.
    assert "uq_email_steps_run_id_step_id" in str(plan) and not _seq_scans(plan)
    assert plan[0]["Plan"]["Actual Rows"] == 50
    index_only = [n for n in _nodes(plan) if n["Node Type"] == "Index Only Scan"]
    assert index_only and index_only[0]["Heap Fetches"] == 0, index_only
    table_reads = [
        n for n in _nodes(plan) if n.get("Relation Name") == "email_steps" and n["Node Type"] != "Index Only Scan"
    ]
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in table_reads) == 50, table_reads
    # The page's history: its 100 evidence rows through the partition's primary key, its 50 decisions.
    assert "evidence_steps_0_pkey" in str(evidence_plan)
    assert "evidence_steps_0" not in _seq_scans(evidence_plan)
    assert evidence_plan[0]["Plan"]["Actual Rows"] == 100 and _rows_read(evidence_plan, "evidence_steps_0") == 100
    assert decisions_plan[0]["Plan"]["Actual Rows"] == 50 and not _seq_scans(decisions_plan)
    # The total: counted from the index, up to the cap.
    assert counted == COUNT_CAP + 1 and not _seq_scans(count_plan)
    assert _rows_read(count_plan, "uq_email_steps_run_id_step_id") == COUNT_CAP + 1


async def rows_exec(url: str, sql: str, params) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(sql, params)


async def test_list_total_holds_past_the_last_page_and_unknown_rows_come_oldest_first(store, db_url):
    from tests.support import unknown_steps

    older = await unknown_steps(store, 2, now=T0)
    newer = await unknown_steps(store, 1, now=T0 + timedelta(hours=1))
    await store.enqueue(valid(), now=T0)
    found, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,), limit=2), now=T0 + timedelta(hours=3))
    assert total == 3 and [f.id for f in found] == [s.id for s in older]
    assert [f.age_seconds for f in found] == [3 * 3600.0, 3 * 3600.0]
    found, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,), limit=2, offset=2))
    assert total == 3 and [f.id for f in found] == [newer[0].id]
    found, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,), limit=2, offset=50))
    assert total == 3 and found == []
    found, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,), limit=None))
    assert total == 3 and len(found) == 3
    found, total = await store.list_steps(StepFilter(run_id="nobody"))
    assert total == 0 and found == []
