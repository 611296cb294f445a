"""Failure matrix rows 2, 3 and 8: the database restarts, is out of reach for longer than a
lease, or refuses writes — while workers are sending."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.acceptance.conftest import Evq, make_key, smtp_env
from tests.faults.cluster import ThrowawayCluster
from tests.faults.conftest import with_port
from tests.faults.proxy import TcpProxy
from tests.support import evidence_kinds, rows, step_row, wait_until

LEASE = 8


def claimants(url: str) -> int:
    """How many workers have claimed a row so far (each attempt_started names its owner)."""
    return rows(url, "SELECT count(DISTINCT actor)::int AS n FROM evidence WHERE kind = 'attempt_started'")[0]["n"]


class Lines:
    """A child's stderr read as it comes, on a thread, so a test can wait for a line."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self._lines.append(line)

    def text(self) -> str:
        return "".join(self._lines)

    def join(self) -> str:
        """Everything, once the child has exited (its end of the pipe closed)."""
        self._thread.join(timeout=30)
        self._stream.close()
        return self.text()


def request(step: str, to: str) -> str:
    return json.dumps(
        {"run_id": "faults", "step_id": step, "to": [to], "from": "agent@example.org", "subject": step, "text": "body"}
    )


def test_postgres_restart_mid_run_loses_and_duplicates_nothing(private_pg, smtp):
    """Row 2: workers reconnect with backoff instead of exiting; outcomes that could not be
    recorded while the server was down are recorded once it is back."""
    evq = Evq(private_pg.url, api_key=private_pg.admin_key)
    lines = "\n".join(request(f"r-{i}", "slow-0.02@example.com") for i in range(150))
    assert evq.run("enqueue", "--file", "-", input=lines).returncode == 0
    workers = [evq.popen("worker", "run", "--drain", "--concurrency", "8", **smtp_env(smtp)) for _ in range(2)]
    try:
        # Both workers sending, not just the first to start: a worker still starting when the
        # server goes down fails fast by design (exit 9), which is not what this row is about.
        wait_until(
            lambda: len(smtp.messages) >= 30 and claimants(private_pg.url) >= 2, timeout=60, what="sends under way"
        )
        private_pg.restart(down_for=2.0)
        codes = [w.wait(120) for w in workers]
    finally:
        for w in workers:
            w.kill()
        logs = [w.communicate()[1] for w in workers]
    assert codes == [0, 0], logs[0][-3000:]
    assert any('"claim_failed"' in log or '"record_retry"' in log for log in logs)
    counts = rows(private_pg.url, "SELECT status, count(*)::int AS n FROM steps_now GROUP BY status")
    assert counts == [{"status": "accepted", "n": 150}]
    assert len(smtp.by_message_id()) == 150 and set(smtp.by_message_id().values()) == {1}
    # One attempt and one answer per step. A claim answered past its send-by limit (it waited
    # for a connection while the server restarted) is handed back unsent, uncounted, not sent
    # to be cut off before connecting: that once made 8 steps take a second attempt.
    assert rows(private_pg.url, "SELECT DISTINCT attempts FROM steps_now") == [{"attempts": 1}]
    answers = rows(
        private_pg.url,
        "SELECT step_id, count(*)::int AS n FROM evidence"
        " WHERE kind IN ('provider_response', 'late_response') GROUP BY step_id",
    )
    assert len(answers) == 150 and {a["n"] for a in answers} == {1}
    # An answer whose outcome waited past its lease (the restart outlasted what was left of
    # it) comes late: the rescuer made the step unknown, and the answer settles it, once.
    late = rows(
        private_pg.url,
        "SELECT e.step_id FROM evidence e WHERE e.kind = 'late_response' AND NOT (e.to_status = 'accepted'"
        " AND EXISTS (SELECT 1 FROM evidence x WHERE x.step_id = e.step_id AND x.kind = 'lease_expired'"
        " AND x.lease_token = e.lease_token))",
    )
    assert late == []
    # Every attempt begun ended in its answer or was handed back unsent.
    kinds = {
        r["kind"]: r["n"] for r in rows(private_pg.url, "SELECT kind, count(*)::int AS n FROM evidence GROUP BY kind")
    }
    assert kinds["attempt_started"] == 150 + kinds.get("attempt_released", 0)


@pytest.fixture
def cluster() -> Iterator[ThrowawayCluster]:
    server = ThrowawayCluster()
    try:
        yield server
    finally:
        server.close()


def _claim_text() -> bytes:
    """A line of the claim statement as the worker sends it (queries.sql without its comments,
    adapters/postgres/queries.py) that no other statement has and no placeholder rewrites."""
    from evq.adapters.postgres.queries import Q

    others = [sql for name, sql in Q.items() if name != "step_claim"]
    for line in Q["step_claim"].splitlines():
        line = line.strip()
        if len(line) > 20 and "%(" not in line and not any(line in sql for sql in others):
            return line.encode()
    raise AssertionError("the claim statement has no line of its own")


CLAIM_TEXT = _claim_text()


def test_rows_claimed_as_postgresql_stops_are_handed_back_and_sent_once(cluster, smtp):
    """Row 2: a claim commits and PostgreSQL stops before its answer reaches the worker, for
    longer than a lease. Those rows were never sent: the worker hands them back (its rescuer
    pass does that first), they go out once, and nothing is rescued as unknown."""
    admin = make_key(cluster.url(), "faults-admin", "admin", created_by=None)
    proxy = TcpProxy("127.0.0.1", cluster.port).start()
    worker = None
    try:
        evq = Evq(with_port(cluster.url(), "127.0.0.1", proxy.port), api_key=admin)
        lines = "\n".join(request(f"c-{i}", "ok@example.com") for i in range(12))
        assert Evq(cluster.url(), api_key=admin).run("enqueue", "--file", "-", input=lines).returncode == 0
        # The worker's second claim runs and commits; its answer is kept from the worker.
        withheld = proxy.withhold_answer(CLAIM_TEXT, nth=2)
        env = smtp_env(
            smtp,
            EVQ_LEASE_SECONDS="4",
            EVQ_SMTP_TIMEOUT="1",
            EVQ_RESCUE_INTERVAL="0.3",
            EVQ_LISTEN="off",
            EVQ_CONCURRENCY="4",
            EVQ_BATCH_SIZE="2",
        )
        worker = evq.popen("worker", "run", "--drain", **env)
        assert withheld.wait(30), "the worker never made a second claim"
        # The first claim's sends finish and are recorded: only the lost claim is in flight.
        wait_until(
            lambda: (
                rows(cluster.url(), "SELECT count(*)::int AS n FROM steps_now WHERE status = 'accepted'")[0]["n"] == 2
            ),
            what="first claim recorded",
        )
        lost = rows(cluster.url(), "SELECT id FROM steps_now WHERE status = 'in_flight'")
        cluster.restart(down_for=5.0)  # longer than the lease
        code = worker.wait(90)
    finally:
        if worker is not None:
            worker.kill()
            log = worker.communicate()[1]
        proxy.stop()
    assert code == 0, log[-3000:]
    assert len(lost) == 2
    statuses = rows(cluster.url(), "SELECT status, count(*)::int AS n FROM steps_now GROUP BY status")
    assert statuses == [{"status": "accepted", "n": 12}], statuses
    assert len(smtp.by_message_id()) == 12 and set(smtp.by_message_id().values()) == {1}
    kinds = rows(
        cluster.url(),
        "SELECT kind, count(*)::int AS n FROM evidence WHERE step_id = ANY(%s) GROUP BY kind ORDER BY kind",
        ([r["id"] for r in lost],),
    )
    assert kinds == [
        {"kind": "attempt_released", "n": 2},
        {"kind": "attempt_started", "n": 4},
        {"kind": "provider_response", "n": 2},
    ], kinds
    assert '"orphan_claims_released"' in log


@pytest.mark.slow
def test_database_out_of_reach_longer_than_a_lease(proxied_url, db_url, smtp, admin_key):
    """Row 3: the send succeeds while the worker cannot reach the database. The rescuer
    (another worker, which can) makes the row unknown; when the first worker's answer
    finally lands it is fenced, kept as evidence, and — definite, and the only attempt —
    settles the row, with evidence saying so."""
    url, proxy = proxied_url
    direct, cut_off = Evq(db_url, api_key=admin_key), Evq(url, api_key=admin_key)
    step = direct.json("enqueue", "--file", "-", input=request("partitioned", "hold@example.com"))["data"]
    worker = cut_off.popen("worker", "run", **smtp_env(smtp))
    try:
        smtp.wait_held(1, timeout=20)
        proxy.partition()
        smtp.release()  # the server says 250; the worker cannot write it down
        time.sleep(LEASE + 1)
        assert direct.run("worker", "run", "--drain", **smtp_env(smtp)).returncode == 0
        assert step_row(db_url, step["id"])["status"] == "unknown"
        proxy.heal()
        wait_until(lambda: step_row(db_url, step["id"])["status"] == "accepted", timeout=30, what="late answer")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        proxy.heal()
        worker.kill()
        _, log = worker.communicate()
    row = step_row(db_url, step["id"])
    assert row["reason"] == "late_answer" and row["attempts"] == 1
    assert evidence_kinds(db_url, step["id"]) == ["attempt_started", "lease_expired", "late_response"]
    late = rows(db_url, "SELECT * FROM evidence WHERE kind = 'late_response'")[0]
    assert late["from_status"] == "unknown" and late["to_status"] == "accepted" and late["detail"]["settled"]
    assert smtp.by_message_id() == {step["message_id"]: 1}
    assert '"claim_failed"' in log and '"late_answer"' in log


def read_only(db_url: str, on: bool) -> None:
    name = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = off")  # this session may still write
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = {"on" if on else "off"}')
        if not on:
            # Sessions keep the setting they started with: end them so the change takes effect.
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


def test_read_only_database(evq: Evq, db_url, smtp):
    """Row 8: enqueue fails clearly and writes nothing; workers stop claiming, say why, and
    no send starts without its attempt committed; they resume when writes come back."""
    ready = evq.json("enqueue", "--file", "-", input=request("before", "ok@example.com"))["data"]
    read_only(db_url, True)
    refused = evq.json("enqueue", "--file", "-", input=request("during", "ok@example.com"), expect=9)
    assert refused["error"]["code"] == "E_DB_UNAVAILABLE" and "read-only" in refused["error"]["message"]
    worker = evq.popen("worker", "run", **smtp_env(smtp, EVQ_LISTEN="off"))
    err = Lines(worker.stderr)
    try:
        # Until the worker has been refused twice (a fixed sleep raced a worker slow to start
        # on a loaded machine, and then saw it claim only after writes were back).
        wait_until(lambda: err.text().count('"read_only": true') >= 2, timeout=60, what="two refused claims")
        assert smtp.messages == []  # nothing sent: the attempt could not be committed
        assert step_row(db_url, ready["id"])["status"] == "pending"
        read_only(db_url, False)
        wait_until(lambda: step_row(db_url, ready["id"])["status"] == "accepted", timeout=30, what="resume")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        read_only(db_url, False)
        worker.kill()
        worker.wait()
        log = err.join()
        worker.stdout.close()
    assert '"read_only": true' in log and "not claiming" in log
    assert rows(db_url, "SELECT step_id FROM steps_now ORDER BY id") == [{"step_id": "before"}]
    assert rows(db_url, "SELECT step_id FROM decisions") == [{"step_id": "before"}]  # the refused enqueue: nothing
    assert smtp.by_message_id() == {ready["message_id"]: 1}
