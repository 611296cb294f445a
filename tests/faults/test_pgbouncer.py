"""Failure matrix row 7: PgBouncer in transaction pooling mode between workers and PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.acceptance.conftest import Evq, smtp_env
from tests.faults.conftest import with_port
from tests.support import free_port, require_binary, rows, spawn, stop, valid, wait_until, with_store


@pytest.fixture
def pgbouncer(db_url: str) -> Iterator[str]:
    """A PgBouncer in transaction mode on loopback in front of the test database."""
    pgbouncer_bin = require_binary("pgbouncer", package="pgbouncer")
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    folder = tempfile.mkdtemp(prefix="evq-pgbouncer-")
    os.chmod(folder, 0o777)  # PgBouncer runs as "nobody" and writes its log and pid here
    port = free_port()
    with open(os.path.join(folder, "userlist.txt"), "w") as f:
        f.write(f'"{info.get("user", "postgres")}" ""\n')
    with open(os.path.join(folder, "pgbouncer.ini"), "w") as f:
        f.write(
            f"""[databases]
* = host={info.get("host", "127.0.0.1")} port={info.get("port", 5432)}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/userlist.txt
pool_mode = transaction
default_pool_size = 4
max_client_conn = 200
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
"""
        )
    for name in os.listdir(folder):
        os.chmod(os.path.join(folder, name), 0o666)
    # PgBouncer refuses to run as root; -u drops to an ordinary user.
    user = ["-u", "nobody"] if os.geteuid() == 0 else []
    proc = spawn(
        [pgbouncer_bin, *user, os.path.join(folder, "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = with_port(db_url, "127.0.0.1", port)
    try:
        wait_until(lambda: _answers(url), timeout=10, what="pgbouncer")
        yield url
    finally:
        stop(proc, grace=10)
        shutil.rmtree(folder, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=1) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def test_workers_behind_pgbouncer_in_transaction_mode(pgbouncer: str, db_url: str, smtp, admin_key):
    evq = Evq(pgbouncer, api_key=admin_key, EVQ_POOLER="transaction")
    lines = "\n".join(
        json.dumps(
            {
                "run_id": "pgb",
                "step_id": f"s{i}",
                "to": ["ok@example.com"],
                "from": "a@example.org",
                "subject": "s",
                "text": "t",
            }
        )
        for i in range(60)
    )
    assert evq.run("enqueue", "--file", "-", input=lines).returncode == 0
    workers = [
        evq.popen("worker", "run", "--drain", "--concurrency", "5", **smtp_env(smtp, EVQ_BATCH_SIZE="3"))
        for _ in range(2)
    ]
    try:
        codes = [w.wait(90) for w in workers]
    finally:
        for w in workers:
            w.kill()
        logs = [w.communicate()[1] for w in workers]
    assert codes == [0, 0], logs[0][-2000:]
    # Prepared statements would fail here ("prepared statement ... does not exist") after
    # five executions; many claims and records ran, so none were used.
    assert rows(db_url, "SELECT status, count(*)::int AS n FROM steps_now GROUP BY status") == [
        {"status": "accepted", "n": 60}
    ]
    assert set(smtp.by_message_id().values()) == {1} and len(smtp.by_message_id()) == 60
    assert all('"listen_disabled"' in log for log in logs)
    assert "does not exist" not in "".join(logs)


def test_listen_auto_notices_notifications_do_not_arrive(pgbouncer: str, smtp):
    """Even with EVQ_POOLER=none (no pooler probe), EVQ_LISTEN=auto probes, finds notifications
    do not come back through the pooler, warns, and polls."""
    evq = Evq(pgbouncer, EVQ_POOLER="none")
    started = time.monotonic()
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"listen_unavailable"' in done.stderr
    assert time.monotonic() - started < 30


def test_two_workers_behind_pgbouncer_with_evq_pooler_unset_send_each_message_once(
    pgbouncer: str, db_url: str, smtp, admin_key
):
    """A forgotten EVQ_POOLER: the worker finds the pooler at start (its backend key is not the
    server's), behaves as EVQ_POOLER=transaction and says so. Before, prepared statements broke
    behind it and an unexpected error while recording made a delivered send look never sent."""
    sends = 1000
    evq = Evq(pgbouncer, api_key=admin_key)
    lines = "\n".join(
        json.dumps(
            {
                "run_id": "pgb",
                "step_id": f"s{i}",
                "to": [f"u{i}@example.com"],
                "from": "a@example.org",
                "subject": "s",
                "text": "t",
            }
        )
        for i in range(sends)
    )
    assert Evq(db_url, api_key=admin_key).run("enqueue", "--file", "-", input=lines).returncode == 0
    env = smtp_env(smtp, EVQ_LOG_LEVEL="warning")
    env.pop("EVQ_POOLER", None)
    workers = [
        evq.popen("worker", "run", "--drain", "--concurrency", "8", **env, EVQ_BATCH_SIZE="10") for _ in range(2)
    ]
    try:
        codes = [w.wait(75) for w in workers]  # about 15 s on a loaded 2-core machine
    finally:
        for w in workers:
            w.kill()
        logs = [w.communicate()[1] for w in workers]
    assert "EVQ_POOLER" not in evq.env
    assert codes == [0, 0], logs[0][-3000:]
    assert all('"pooler_detected"' in log for log in logs)
    delivered = smtp.by_message_id()
    assert len(delivered) == sends and set(delivered.values()) == {1}
    assert rows(db_url, "SELECT status, count(*)::int AS n FROM steps_now GROUP BY status") == [
        {"status": "accepted", "n": sends}
    ]
    # A hand-back is of an attempt never sent: no released lease has an answer. (A claim answered
    # past its send-by limit on a loaded machine is handed back and sent later, by another lease.)
    handed_back_and_answered = rows(
        db_url,
        "SELECT r.step_id FROM evidence r JOIN evidence a ON a.step_id = r.step_id AND a.lease_token = r.lease_token"
        " WHERE r.kind = 'attempt_released' AND a.kind IN ('provider_response', 'late_response')",
    )
    assert handed_back_and_answered == []
    for broken in ("InvalidSqlStatementName", "DuplicatePreparedStatement", '"record_retry"', '"claim_failed"'):
        assert broken not in "".join(logs)


def test_evq_serve_behind_pgbouncer_with_evq_pooler_unset_answers_without_500s(pgbouncer: str, db_url: str, admin_key):
    """`evq serve` answered 500s (DuplicatePreparedStatement) behind a transaction pooler once its
    statements had run five times on a connection; it detects the pooler too."""
    import threading

    from tests.web.support import serving

    steps = [
        with_store(db_url, lambda store, i=i: store.enqueue(valid(run_id="serve", step_id=f"s{i}"))) for i in range(5)
    ]
    answers: list[int | str] = []
    with serving(pgbouncer) as served:

        def hammer() -> None:
            client = served.client(admin_key)
            for i in range(30):
                for path, params in (("/v1/steps", {"limit": 3}), (f"/v1/steps/{steps[i % len(steps)].id}", {})):
                    try:
                        answers.append(client.get(path, params=params).status_code)
                    except Exception as exc:  # a hung or dropped request is an answer too
                        answers.append(type(exc).__name__)
                        return  # one hung request per thread is enough to know

        threads = [threading.Thread(target=hammer) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert set(answers) == {200}, sorted(set(map(str, answers)))
    assert len(answers) == 6 * 60


async def test_the_probe_tells_a_pooler_from_postgresql_itself(pgbouncer: str, db_url: str):
    from evq.adapters.postgres.pooler import PoolerProbe, probe

    assert await probe(db_url) == PoolerProbe(pooled=False, shares_backends=False)
    assert await probe(pgbouncer) == PoolerProbe(pooled=True, shares_backends=True)


def test_listen_on_behind_a_pooler_is_refused_with_a_clear_error(pgbouncer: str):
    out = Evq(pgbouncer).json("worker", "run", "--drain", expect=2, EVQ_LISTEN="on")
    assert out["error"]["code"] == "E_INVALID_ARG" and "pooler" in out["error"]["message"]
