"""/metrics against a real database with rows in every state, scraped over real HTTP."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from prometheus_client import REGISTRY

from bench import collector as collector_bench
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.queue_stats import QueueStatsReader
from evq.adapters.postgres.store import PostgresStore
from evq.ops.app.metrics import QueueCollector, render
from evq.ops.settings import Settings
from evq.ops.wiring import metrics_endpoint
from evq.worker.errors import ConfigError, DatabaseUnavailable, StateConflict
from evq.worker.metrics import PENDING_AGE_BUCKETS, UNKNOWN_AGE_BUCKETS
from evq.worker.outcomes import Retryable, Unknown
from evq.worker.rescuer import Rescuer, RescuerConfig
from evq.worker.resolution import Resolution
from evq.worker.runner import Worker
from evq.worker.states import Status
from tests.support import (
    ScriptedProvider,
    evidence_kinds,
    execute,
    free_port,
    put_in_state,
    rows,
    sample,
    scrape,
    step_row,
    unknown_steps,
    valid,
)

WORKER = Settings(
    adapter=("smtp",),
    concurrency=5,
    batch_size=5,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0,
    retry_max=0,
    rescue_interval=0.2,
    shutdown_grace=5,
    smtp_timeout=5,
)

# Every state, as (status, SET clause relative to the database clock).
STATES = [
    ("pending", "next_attempt_at = now() - interval '10 minutes'"),  # due for 10 minutes: the queue lag
    ("pending", "next_attempt_at = now()"),
    ("pending", "next_attempt_at = now() + interval '1 hour'"),  # scheduled: not lag
    ("retryable", "attempts = 1, first_attempt_at = now(), next_attempt_at = now() + interval '10 minutes'"),
    (
        "in_flight",
        "attempts = 1, first_attempt_at = now(), lease_owner = 'w', lease_token = gen_random_uuid(), "
        "lease_expires_at = now() + interval '1 minute'",
    ),
    (
        "in_flight",
        "attempts = 1, first_attempt_at = now(), lease_owner = 'w', lease_token = gen_random_uuid(), "
        "lease_expires_at = now() - interval '1 minute'",
    ),  # expired, not yet rescued
    ("unknown", "attempts = 1, first_attempt_at = now(), unknown_since = now() - interval '90 seconds'"),
    ("unknown", "attempts = 1, first_attempt_at = now(), unknown_since = now() - interval '90 minutes'"),
    ("unknown", "attempts = 1, first_attempt_at = now(), unknown_since = now() - interval '3 days'"),
    *[("accepted", "attempts = 1, first_attempt_at = now(), closed_at = now()")] * 4,
    *[("rejected", "attempts = 1, first_attempt_at = now(), closed_at = now()")] * 2,
]


async def _rows_in_every_state(store: PostgresStore, db_url: str) -> None:
    for status, assignments in STATES:
        step = await store.enqueue(valid())
        put_in_state(db_url, step.id, status, assignments)


async def test_scrape_reports_counts_ages_and_buckets_from_the_database(store, db_url):
    await _rows_in_every_state(store, db_url)
    with metrics_endpoint(Settings(metrics_port=0), db_url) as server:
        base = f"http://127.0.0.1:{server.port}"
        page = scrape(f"{base}/metrics")
        # Off the event loop: a blocking call on it would stall whatever else the loop runs.
        with await asyncio.to_thread(urllib.request.urlopen, f"{base}/healthz", timeout=5) as response:
            assert response.status == 200 and response.read() == b"ok\n"
        with pytest.raises(urllib.error.HTTPError) as missing:
            await asyncio.to_thread(urllib.request.urlopen, f"{base}/nothing", timeout=5)
        assert missing.value.code == 404
        missing.value.close()

    counts = {
        s: sample(page, "evq_steps", status=s)
        for s in ("pending", "retryable", "in_flight", "unknown", "accepted", "rejected")
    }
    assert counts == {"pending": 3, "retryable": 1, "in_flight": 2, "unknown": 3, "accepted": 4, "rejected": 2}
    assert sample(page, "evq_in_flight_expired") == 1
    # Ages are measured on the database clock; the test itself takes a few seconds at most.
    three_days = 3 * 86400
    assert three_days <= sample(page, "evq_unknown_oldest_age_seconds") < three_days + 60
    assert 600 <= sample(page, "evq_pending_oldest_age_seconds") < 660
    buckets = [sample(page, "evq_unknown_age_seconds_bucket", le=f"{le:.1f}") for le in UNKNOWN_AGE_BUCKETS]
    # 90 s, 90 min and 3 days: cumulative counts per bucket, 1 min .. 7 days.
    assert buckets == [0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3]
    assert sample(page, "evq_unknown_age_seconds_bucket", le="+Inf") == 3
    assert sample(page, "evq_unknown_age_seconds_gcount") == 3
    assert 90 + 5400 + three_days <= sample(page, "evq_unknown_age_seconds_gsum") < 90 + 5400 + three_days + 180
    assert sample(page, "evq_collector_up") == 1
    # The in-process catalogue is on the same page.
    assert sample(page, "evq_enqueued_total") is not None


async def test_ages_are_exact_against_a_fixed_clock_and_bucket_bounds_are_inclusive(store, db_url):
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    for age in (60, 3600, 3601):
        step = await store.enqueue(valid())
        execute(
            db_url,
            "UPDATE email_steps SET status = 'unknown', attempts = 1, first_attempt_at = %s, unknown_since = %s "
            "WHERE id = %s",
            (now, now - timedelta(seconds=age), step.id),
        )
        execute(db_url, "DELETE FROM step_queue WHERE id = %s", (step.id,))
    due = await store.enqueue(valid(), now=now - timedelta(seconds=42))
    reader = QueueStatsReader(db_url)
    try:
        stats = reader.read(UNKNOWN_AGE_BUCKETS, now=now)
    finally:
        reader.close()
    assert stats.unknown_oldest_age == 3601 and stats.unknown_age_sum == 60 + 3600 + 3601
    # A row exactly 60 s old is in le="60", as Prometheus's le (less than or equal) says.
    assert dict(stats.unknown_buckets)[60.0] == 1 and dict(stats.unknown_buckets)[3600.0] == 2
    assert dict(stats.unknown_buckets)[7200.0] == 3
    assert stats.pending_oldest_age == 42 and due.id


async def test_queue_lag_ignores_rows_waiting_for_their_backoff_or_their_schedule(store, db_url):
    """A healthy retry (enqueued long ago, backing off) and a send scheduled for later are not lag:
    only rows claimable now count, from the moment they became due."""
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    backing_off = await store.enqueue(valid(), now=now - timedelta(hours=5))
    for table, status in (("email_steps", "status = 'retryable', "), ("step_queue", "")):
        execute(
            db_url,
            f"UPDATE {table} SET {status}attempts = 2, first_attempt_at = %s, updated_at = %s, "
            "next_attempt_at = %s WHERE id = %s",
            (now - timedelta(hours=5), now - timedelta(minutes=1), now + timedelta(minutes=14), backing_off.id),
        )
    await store.enqueue(valid(), now=now + timedelta(hours=1))  # scheduled: due in an hour
    reader = QueueStatsReader(db_url)
    try:
        assert reader.read(UNKNOWN_AGE_BUCKETS, now=now).pending_oldest_age == 0
        # Its backoff over, the retry is claimable and its wait counts from when it became due.
        later = now + timedelta(minutes=14, seconds=30)
        assert reader.read(UNKNOWN_AGE_BUCKETS, now=later).pending_oldest_age == 30
    finally:
        reader.close()


def test_a_locked_table_costs_one_failed_scrape_bounded_by_the_statement_timeout(db_url):
    reader = QueueStatsReader(db_url, timeout=0.2)
    collector = QueueCollector(reader.read)
    try:
        with psycopg.connect(db_url) as locker:
            # A migration holding an exclusive lock: the collector's query waits, then is canceled.
            locker.execute("LOCK TABLE email_steps IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(DatabaseUnavailable, match="did not answer in time"):
                reader.read(UNKNOWN_AGE_BUCKETS)
            body, _ = render(collector)
            assert b"evq_collector_up 0.0" in body and b"evq_steps{" not in body
        # The lock is gone: the next scrape reads again (on a fresh connection).
        body, _ = render(collector)
        assert b"evq_collector_up 1.0" in body and b'evq_steps{status="unknown"} 0.0' in body
    finally:
        reader.close()


def test_an_unreachable_database_reads_as_collector_down():
    reader = QueueStatsReader(f"postgresql://postgres@127.0.0.1:{free_port()}/evq", timeout=1)
    try:
        with pytest.raises(DatabaseUnavailable):
            reader.read(UNKNOWN_AGE_BUCKETS)
        body, _ = render(QueueCollector(reader.read))
    finally:
        reader.close()
    assert b"evq_collector_up 0.0" in body


def test_a_busy_metrics_port_is_a_clear_config_error(db_url):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"EVQ_METRICS_PORT.*127.0.0.1:{port}"):
            with metrics_endpoint(Settings(metrics_port=port), db_url):
                pass


def test_no_port_no_server(db_url):
    with metrics_endpoint(Settings(), db_url) as server:
        assert server is None


def _plan_nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def test_collector_query_reads_the_partial_indexes_not_the_table(db_url):
    # 20,000 terminal rows and a live backlog in every state; an exact_limit below the
    # terminal counts takes the estimate path that a big table takes in production.
    filled = collector_bench.fill(db_url, terminal=20_000)
    with psycopg.connect(db_url) as conn:
        [[plan]] = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + Q["queue_stats"],
            {
                "now": None,
                "buckets": list(UNKNOWN_AGE_BUCKETS),
                "pending_buckets": list(PENDING_AGE_BUCKETS),
                "exact_limit": 1000,
            },
        ).fetchall()
    # The history (email_steps) is read through its partial indexes only; the queue (step_queue)
    # holds the live backlog alone, which the planner may read whole when it is this small.
    nodes = [n for n in _plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "email_steps"]
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], json.dumps(nodes, indent=1)
    ran = {n.get("Index Name") for n in nodes if n["Actual Loops"] > 0}
    assert {"ix_email_steps_unknown_since", "ix_email_steps_held"} <= ran, ran
    queue = [n for n in _plan_nodes(plan[0]["Plan"]) if n.get("Relation Name") == "step_queue"]
    assert queue and sum(n["Actual Rows"] for n in queue) <= 3 * sum(
        filled[s] for s in ("pending", "retryable", "in_flight")
    )
    # The only full-table index read is the (status, created_at) range of the two live states
    # without a partial index of their own; the terminal states' exact count never runs.
    for n in nodes:
        if n.get("Index Name") == "ix_email_steps_status_created_at" and n["Actual Loops"] > 0:
            assert n["Node Type"] == "Index Only Scan" and (
                "'pending'" in n["Index Cond"] or "'retryable'" in n["Index Cond"]
            )
    reader = QueueStatsReader(db_url, exact_limit=1000)
    try:
        stats = reader.read(UNKNOWN_AGE_BUCKETS)
    finally:
        reader.close()
    assert stats.estimated == ("accepted", "rejected")
    assert abs(stats.steps["accepted"] - filled["accepted"]) <= filled["accepted"] * 0.05
    live = collector_bench.LIVE
    assert stats.steps["unknown"] == filled["unknown"] == live["unknown"]
    assert stats.steps["pending"] == live["pending_due"] + live["pending_later"]
    assert stats.in_flight_expired == live["expired"]
    # The claimable rows' waiting times (due 30 s ago), read through the claim's own index.
    buckets = dict(stats.pending_buckets)
    assert stats.pending_due == live["pending_due"] and buckets[15.0] == 0 and buckets[60.0] == live["pending_due"]
    assert 25 * live["pending_due"] < stats.pending_age_sum < 120 * live["pending_due"]


def test_collector_bench_prints_its_query_time(db_url):
    out = io.StringIO()
    assert collector_bench.main(["--in-place", "--database-url", db_url, "--repeat", "2"], out) == 0
    result = json.loads(out.getvalue())
    assert result["query_ms"]["median"] > 0 and result["steps"]["pending"] == 0


def test_collector_bench_fills_a_scratch_database(pg_server):
    out = io.StringIO()
    assert collector_bench.main(["--database-url", pg_server, "--rows", "2000", "--repeat", "2"], out) == 0
    result = json.loads(out.getvalue())
    assert result["rows"] == 2000 and result["steps"]["accepted"] + result["steps"]["rejected"] == 2000
    assert result["estimated"] == []  # under the exact limit: counted
    with psycopg.connect(pg_server) as conn:
        left = conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'evq_collector_bench_%'").fetchone()
    assert left == (0,)


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_worker_counts_sends_closings_and_decision_lag(store, db_url):
    enqueued_at = datetime.now(UTC) - timedelta(hours=1)
    decided = {"model": "m-1", "decided_at": (enqueued_at - timedelta(seconds=30)).isoformat()}
    before = {
        "accepted": _value("evq_send_attempts_total", provider="smtp", outcome="accepted"),
        "retryable": _value("evq_send_attempts_total", provider="smtp", outcome="retryable"),
        "unknown": _value("evq_send_attempts_total", provider="smtp", outcome="unknown"),
        "timed": _value("evq_send_duration_seconds_count", provider="smtp", outcome="accepted"),
        "closed": _value("evq_action_to_evidence_seconds_count"),
        "closed_within_15m": _value("evq_action_to_evidence_seconds_bucket", le="900.0"),
        "closed_within_4h": _value("evq_action_to_evidence_seconds_bucket", le="14400.0"),
        "decisions": _value("evq_decision_to_enqueue_seconds_count"),
        "decision_seconds": _value("evq_decision_to_enqueue_seconds_sum"),
        "enqueued": _value("evq_enqueued_total"),
    }
    for step_id in ("ok", "flaky", "lost"):
        await store.enqueue(valid(step_id=step_id, decision=decided), now=enqueued_at)
    provider = ScriptedProvider(script={"run-1/flaky": [Retryable("451 busy")], "run-1/lost": [Unknown("reset")]})
    assert await Worker(store, {"smtp": provider}, WORKER.worker_config()).run(drain=True, install_signals=False) == 0

    assert _value("evq_enqueued_total") == before["enqueued"] + 3
    assert _value("evq_decision_to_enqueue_seconds_count") == before["decisions"] + 3
    assert _value("evq_decision_to_enqueue_seconds_sum") == pytest.approx(before["decision_seconds"] + 90)
    assert _value("evq_send_attempts_total", provider="smtp", outcome="accepted") == before["accepted"] + 2
    assert _value("evq_send_attempts_total", provider="smtp", outcome="retryable") == before["retryable"] + 1
    assert _value("evq_send_attempts_total", provider="smtp", outcome="unknown") == before["unknown"] + 1
    assert _value("evq_send_duration_seconds_count", provider="smtp", outcome="accepted") == before["timed"] + 2
    # Two steps closed (ok, flaky) about an hour after their enqueue; the unknown one did not close.
    assert _value("evq_action_to_evidence_seconds_count") == before["closed"] + 2
    assert _value("evq_action_to_evidence_seconds_bucket", le="900.0") == before["closed_within_15m"]
    assert _value("evq_action_to_evidence_seconds_bucket", le="14400.0") == before["closed_within_4h"] + 2

    # The same numbers reach a scrape over HTTP.
    with metrics_endpoint(Settings(metrics_port=0), db_url) as server:
        page = scrape(f"http://127.0.0.1:{server.port}/metrics")
    assert sample(page, "evq_send_attempts_total", provider="smtp", outcome="unknown") == before["unknown"] + 1
    assert sample(page, "evq_steps", status="unknown") == 1 and sample(page, "evq_steps", status="accepted") == 2


async def test_rescues_are_counted_by_the_state_they_lead_to(store, db_url):
    step = await store.enqueue(valid())
    put_in_state(
        db_url,
        step.id,
        "in_flight",
        "attempts = 1, first_attempt_at = now(), lease_owner = 'dead', "
        "lease_token = gen_random_uuid(), lease_expires_at = now() - interval '1 second'",
    )
    before = _value("evq_rescued_total", to="unknown")
    counts = await Rescuer(store, RescuerConfig(lease_seconds=30)).run_once()
    assert counts.unknown == 1
    assert _value("evq_rescued_total", to="unknown") == before + 1


async def test_a_zombies_late_answer_is_counted_as_fenced_and_as_a_late_settlement(store, db_url):
    step = await store.enqueue(valid())
    gate = asyncio.Event()
    provider = ScriptedProvider(gate=gate)  # the send hangs until the gate opens
    worker = Worker(store, {"smtp": provider}, WORKER.worker_config())
    task = asyncio.create_task(worker.run(install_signals=False))
    try:
        while provider.in_send < 1:
            await asyncio.sleep(0.01)
        # Meanwhile its lease runs out and a rescuer makes the row unknown.
        past_lease = datetime.now(UTC) + timedelta(seconds=WORKER.lease_seconds + 1)
        rescued = await store.rescue(
            limit=10, lease_seconds=WORKER.lease_seconds, default_max_attempts=5, actor="rescuer", now=past_lease
        )
        assert rescued.unknown == 1
        fenced, settled = _value("evq_fence_rejections_total"), _value("evq_late_settlements_total")
        gate.set()  # the zombie's answer (accepted) arrives after its lease was lost
        while "late_response" not in evidence_kinds(db_url, step.id):
            await asyncio.sleep(0.01)
    finally:
        gate.set()
        worker.request_stop()
        assert await asyncio.wait_for(task, 10) == 0
    assert _value("evq_fence_rejections_total") == fenced + 1
    assert _value("evq_late_settlements_total") == settled + 1  # definite, and no later attempt: it closed the row
    assert step_row(db_url, step.id)["reason"] == "late_answer"


async def test_operators_verdicts_are_counted_by_verdict(store, db_url):
    steps = await unknown_steps(store, 3)
    before = {v: _value("evq_resolutions_total", **{"as": v}) for v in ("accepted", "rejected", "retry")}
    for step, verdict in zip(steps, ("accepted", "rejected", "retry"), strict=True):
        await store.resolve(step.id, Resolution.parse(verdict, "checked"), actor="alice", default_max_attempts=3)
    with pytest.raises(StateConflict):  # refused: counts nothing
        await store.resolve(steps[0].id, Resolution.parse("rejected", "again"), actor="bob", default_max_attempts=3)
    assert {v: _value("evq_resolutions_total", **{"as": v}) - before[v] for v in before} == {
        "accepted": 1,
        "rejected": 1,
        "retry": 1,
    }


def test_an_empty_queue_reports_every_status_at_zero(db_url):
    """Every status is a series from the first scrape (0, not absent), and 'none' ages are 0."""
    with metrics_endpoint(Settings(metrics_port=0), db_url) as server:
        page = scrape(f"http://127.0.0.1:{server.port}/metrics")
    assert {s: sample(page, "evq_steps", status=s) for s in Status} == {str(s): 0 for s in Status}
    for name in (
        "evq_unknown_oldest_age_seconds",
        "evq_pending_oldest_age_seconds",
        "evq_in_flight_expired",
        "evq_unknown_age_seconds_gcount",
    ):
        assert sample(page, name) == 0, name
    assert sample(page, "evq_unknown_age_seconds_bucket", le="604800.0") == 0
    assert sample(page, "evq_collector_up") == 1


async def test_evidence_partitions_ahead_and_the_overflow_are_read_from_the_catalog(store, db_url):
    """The migration makes four partitions ahead of an empty table; steps past the last one
    put their evidence in the overflow partition, and the gauges say so."""
    reader = QueueStatsReader(db_url)
    try:
        fresh = reader.read(UNKNOWN_AGE_BUCKETS)
        assert (fresh.evidence_partitions_ahead, fresh.evidence_overflow_rows) == (4, 0)
        top = rows(db_url, "SELECT max(hi) AS top FROM evq_evidence_partitions()")[0]["top"]
        execute(db_url, "SELECT setval(pg_get_serial_sequence('email_steps', 'id'), %s)", (top + 10,))
        step = await store.enqueue(valid())
        await store.claim(owner="w", providers=[step.provider], limit=1, lease_seconds=60, dedupe_windows={})
        execute(db_url, "ANALYZE evidence_overflow")  # the statistics the gauge reads, made now
        behind = reader.read(UNKNOWN_AGE_BUCKETS)
        held = rows(db_url, "SELECT count(*) AS n FROM evidence_overflow")[0]["n"]
        assert held >= 1 and (behind.evidence_partitions_ahead, behind.evidence_overflow_rows) == (0, held)
        # The next partitions start above what the overflow holds: four ahead again.
        execute(db_url, "SELECT evq_evidence_partitions_ahead(1000000)")
        assert reader.read(UNKNOWN_AGE_BUCKETS).evidence_partitions_ahead == 4
    finally:
        reader.close()


def test_a_connection_the_server_ended_since_the_last_read_is_reopened_not_reported(db_url):
    """The reader keeps its connection between reads; a server restart (or an idle timeout, a
    pooler's recycle) ends it meanwhile. The next read is of a database that answers, so it
    reconnects and reads, instead of saying the counts cannot be read (the overview's first
    page after PostgreSQL came back said so, with the old connection's error)."""
    reader = QueueStatsReader(db_url)
    try:
        before = reader.read(UNKNOWN_AGE_BUCKETS)
        assert reader._conn is not None
        pid = reader._conn.info.backend_pid
        with psycopg.connect(db_url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
            wait_until_gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
            for _ in range(200):
                if not admin.execute(wait_until_gone, (pid,)).fetchone()[0]:
                    break
        after = reader.read(UNKNOWN_AGE_BUCKETS)
        assert after.steps == before.steps
        assert reader._conn is not None and reader._conn.info.backend_pid != pid
    finally:
        reader.close()
