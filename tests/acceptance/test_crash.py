"""Worker processes killed, stopped and paused mid-send, against a real SMTP server."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.acceptance.conftest import Evq, smtp_env
from tests.support import evidence_kinds, pause, rows, step_row

LEASE = 8  # seconds; must exceed 3 x EVQ_SMTP_TIMEOUT (2)


def enqueue(evq: Evq, step: str, to: str = "hold@example.com") -> dict:
    request = {
        "run_id": "crash",
        "step_id": step,
        "to": [to],
        "from": "agent@example.org",
        "subject": step,
        "text": "body",
    }
    return evq.json("enqueue", "--file", "-", input=json.dumps(request))["data"]


def wait_until(predicate, timeout: float = 20, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# Slow: each waits out a real lease (LEASE + 0.5 s), so it starts first under xdist (tests/conftest.py).
@pytest.mark.slow
def test_worker_killed_mid_send_leaves_unknown_and_never_resends(evq: Evq, smtp, db_url):
    step = enqueue(evq, "killed")
    worker = evq.popen("worker", "run", **smtp_env(smtp))
    try:
        smtp.wait_held(1, timeout=20)  # the message is on the server; its 250 is held back
        assert step_row(db_url, step["id"])["status"] == "in_flight"
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
        worker.communicate()
        smtp.release()
    # A second worker, after the lease has run out, rescues the row as unknown and sends nothing.
    time.sleep(LEASE + 0.5)
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    row = step_row(db_url, step["id"])
    assert row["status"] == "unknown" and row["reason"] == "lease_expired" and row["attempts"] == 1
    assert evidence_kinds(db_url, step["id"]) == ["attempt_started", "lease_expired"]
    assert smtp.by_message_id() == {step["message_id"]: 1}


GRACE = 10  # EVQ_SHUTDOWN_GRACE for the SIGTERM tests; a send to slow-1.5@ takes 1.5 s


def test_sigterm_lets_in_flight_sends_finish_then_exits_0(evq: Evq, smtp, db_url):
    """A busy run (more rows than the worker sends at once): the sends in flight finish and are
    recorded, nothing more is claimed, the process exits 0 well inside the grace period."""
    steps = [enqueue(evq, f"term-{i}", to="slow-1.5@example.com") for i in range(9)]
    worker = evq.popen("worker", "run", "--concurrency", "3", **smtp_env(smtp, EVQ_SHUTDOWN_GRACE=str(GRACE)))
    try:
        wait_until(
            lambda: rows(db_url, "SELECT count(*)::int AS n FROM steps_now WHERE status = 'in_flight'")[0]["n"] == 3,
            what="three sends in flight",
        )
        in_flight = {r["id"] for r in rows(db_url, "SELECT id FROM steps_now WHERE status = 'in_flight'")}
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(GRACE)  # a wait past the grace would raise: the worker must be gone by then
    finally:
        worker.kill()
        _, stderr = worker.communicate()
    assert code == 0, stderr[-2000:]
    statuses = {s["id"]: step_row(db_url, s["id"])["status"] for s in steps}
    assert {i for i, status in statuses.items() if status == "accepted"} >= in_flight
    assert set(statuses.values()) <= {"accepted", "pending"} and "pending" in statuses.values()
    assert all(step_row(db_url, i)["attempts"] == 0 for i, status in statuses.items() if status == "pending")
    assert set(smtp.by_message_id().values()) == {1}
    assert '"shutdown_requested"' in stderr and '"clean": true' in stderr


def test_sigterm_whose_grace_runs_out_exits_1_and_leaves_the_send_to_the_rescuer(evq: Evq, smtp, db_url):
    step = enqueue(evq, "held")
    worker = evq.popen("worker", "run", **smtp_env(smtp, EVQ_SHUTDOWN_GRACE="1"))
    try:
        smtp.wait_held(1, timeout=20)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(GRACE)
    finally:
        worker.kill()
        _, stderr = worker.communicate()
        smtp.release()
    assert code == 1, stderr[-2000:]
    assert '"grace_expired"' in stderr and '"clean": false' in stderr
    assert step_row(db_url, step["id"])["status"] == "in_flight"  # the rescuer's, once the lease runs out


def test_second_signal_exits_130_and_leaves_the_row_to_the_rescuer(evq: Evq, smtp, db_url):
    step = enqueue(evq, "impatient")
    worker = evq.popen("worker", "run", **smtp_env(smtp))
    try:
        smtp.wait_held(1, timeout=20)
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert worker.poll() is None  # still waiting for the send in flight
        worker.send_signal(signal.SIGINT)
        code = worker.wait(10)
    finally:
        worker.kill()
        worker.communicate()
        smtp.release()
    assert code == 130
    assert step_row(db_url, step["id"])["status"] == "in_flight"


@pytest.mark.slow
def test_paused_worker_answers_late_its_answer_is_kept_and_changes_nothing(evq: Evq, smtp, db_url):
    """A zombie (SIGSTOP past its lease): the rescuer makes the row unknown. When the
    zombie wakes, its SMTP read has long timed out after the final dot, so its answer
    is ambiguous: it is kept as evidence and the row is left exactly as the rescuer
    left it. (A definite late answer would settle the row: test_store covers that.)"""
    step = enqueue(evq, "zombie")
    zombie = evq.popen("worker", "run", **smtp_env(smtp))
    try:
        smtp.wait_held(1, timeout=20)
        pause(zombie.pid)
        time.sleep(LEASE + 0.5)
        rescuer = evq.run("worker", "run", "--drain", **smtp_env(smtp))
        assert rescuer.returncode == 0
        before = step_row(db_url, step["id"])
        assert before["status"] == "unknown"
        os.kill(zombie.pid, signal.SIGCONT)
        wait_until(lambda: "late_response" in evidence_kinds(db_url, step["id"]), what="late answer")
        zombie.send_signal(signal.SIGTERM)
        assert zombie.wait(20) == 0
    finally:
        zombie.kill()
        zombie.communicate()
        smtp.release()
    after = step_row(db_url, step["id"])
    assert {k: after[k] for k in ("status", "reason", "updated_at", "attempts")} == {
        k: before[k] for k in ("status", "reason", "updated_at", "attempts")
    }
    assert evidence_kinds(db_url, step["id"]) == ["attempt_started", "lease_expired", "late_response"]
    late = rows(db_url, "SELECT * FROM evidence WHERE kind = 'late_response'")[0]
    assert late["detail"]["fenced"] is True and late["outcome"] == "unknown" and late["to_status"] is None
    assert smtp.by_message_id() == {step["message_id"]: 1}


@pytest.mark.slow
def test_paused_worker_whose_row_moved_on_changes_nothing(evq: Evq, smtp, db_url):
    """When the row has moved on since the rescue (here an operator closed it), the
    zombie's answer is evidence only."""
    step = enqueue(evq, "moved-on")
    zombie = evq.popen("worker", "run", **smtp_env(smtp))
    try:
        smtp.wait_held(1, timeout=20)
        pause(zombie.pid)
        time.sleep(LEASE + 0.5)
        assert evq.run("worker", "run", "--drain", **smtp_env(smtp)).returncode == 0
        # Stand-in for an operator's verdict (the audited command is `evq steps resolve`).
        rows(
            db_url,
            "UPDATE email_steps SET status = 'rejected', reason = 'operator', unknown_since = NULL, "
            "closed_at = now() WHERE id = %s RETURNING id",
            (step["id"],),
        )
        smtp.release()
        os.kill(zombie.pid, signal.SIGCONT)
        wait_until(lambda: "late_response" in evidence_kinds(db_url, step["id"]), what="late answer")
        zombie.send_signal(signal.SIGTERM)
        zombie.wait(20)
    finally:
        zombie.kill()
        zombie.communicate()
    row = step_row(db_url, step["id"])
    assert row["status"] == "rejected" and row["reason"] == "operator" and row["provider_message_id"] is None
    late = rows(db_url, "SELECT * FROM evidence WHERE kind = 'late_response'")[0]
    assert late["to_status"] is None and late["detail"]["settled"] is False
