"""Failure matrix row 1: workers killed with SIGKILL at random moments, again and again,
during a run of a few thousand sends, and one of them paused past its lease. Nothing may be
sent twice; every row must end terminal or unknown, and every unknown row must be a send
that was in flight when its worker died or lost its lease (the paused worker, or any worker
a loaded machine starved that long: it says so in a late answer when it runs again), or one
whose worker waited out EVQ_SMTP_TIMEOUT for the answer to the message and said so."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time

import pytest

from tests.acceptance.conftest import Evq, smtp_env
from tests.support import pause, rows, spawn, wait_until

SENDS = int(os.environ.get("EVQ_CHAOS_SENDS", "2000"))
WORKERS = 3
LEASE = 4  # > 3 x EVQ_SMTP_TIMEOUT (1)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a few thousand sends and a hundred kills; the suite default is 120 s
def test_sigkill_chaos(evq: Evq, db_url, smtp, tmp_path):
    lines = "\n".join(
        json.dumps(
            {
                "run_id": "chaos",
                "step_id": f"s{i}",
                "to": [f"u{i}@example.com"],
                "from": "a@example.org",
                "subject": f"chaos {i}",
                "text": "t",
            }
        )
        for i in range(SENDS)
    )
    assert evq.run("enqueue", "--file", "-", input=lines, timeout=120).returncode == 0
    env = smtp_env(
        smtp, EVQ_SMTP_TIMEOUT="1", EVQ_LEASE_SECONDS=str(LEASE), EVQ_RESCUE_INTERVAL="0.5", EVQ_LOG_LEVEL="warning"
    )
    rng = random.Random(int(os.environ.get("EVQ_CHAOS_SEED", "7")))
    log = open(tmp_path / "workers.log", "ab")  # shared by every worker started below

    def start() -> subprocess.Popen:
        # Output to a file: a pipe nobody reads would fill up and stall the worker.
        return spawn(
            evq.cmd("worker", "run", "--concurrency", "8"),
            env={**evq.env, **env, "EVQ_BATCH_SIZE": "8"},  # a documented constant (tests/child.py)
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

    workers = [start() for _ in range(WORKERS)]
    killed: set[int] = set()
    paused: int | None = None
    deadline = time.monotonic() + 120

    def open_rows() -> int:
        return rows(db_url, "SELECT count(*)::int AS n FROM steps_now WHERE status IN ('pending', 'retryable')")[0]["n"]

    def in_flight() -> dict[int, set[int]]:
        """The rows in flight, by the pid of the worker whose lease holds them."""
        held: dict[int, set[int]] = {}
        for r in rows(db_url, "SELECT id, lease_owner AS owner FROM steps_now WHERE status = 'in_flight'"):
            held.setdefault(int(r["owner"].split(":")[1]), set()).add(r["id"])
        return held

    def rescued(pid: int, ids: set[int]) -> set[int]:
        """Which of ``ids`` a rescuer took from the worker ``pid`` when its lease ran out."""
        got = rows(
            db_url,
            "SELECT step_id AS id, detail ->> 'lease_owner' AS owner FROM evidence "
            "WHERE kind = 'lease_expired' AND step_id = ANY(%s)",
            (sorted(ids),),
        )
        return {r["id"] for r in got if int(r["owner"].split(":")[1]) == pid}

    def pause_one_past_its_lease() -> int | None:
        """Freeze (SIGSTOP) a worker holding rows in flight until the others' rescuers have
        taken them, then wake it; its pid, or None if none could be tried this time."""
        holders = in_flight()
        for worker in [w for w in workers if w.pid in holders]:
            pause(worker.pid)
            # Read once it is stopped: only a rescuer can move these rows now. Its last
            # answers may have landed between the two reads, so it may hold none by now.
            held = in_flight().get(worker.pid, set())
            try:
                if held:
                    # Its lease runs out within LEASE; rescuers pass every 0.5 s. A row whose
                    # update the frozen worker had begun in a transaction stays locked until it
                    # wakes: then this try gives up and a later one tries again.
                    with contextlib.suppress(AssertionError):
                        wait_until(
                            lambda held=held, pid=worker.pid: not held & in_flight().get(pid, set()),
                            timeout=4 * LEASE,
                            interval=0.25,
                            what="the paused worker's rows rescued",
                        )
                        # A statement the server was running for it when it stopped (a batch
                        # of answers) may have moved them instead: only a rescue counts.
                        if rescued(worker.pid, held):
                            return worker.pid
            finally:
                os.kill(worker.pid, signal.SIGCONT)
        return None

    try:
        while open_rows() > SENDS // 10 and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.2, 0.8))
            if paused is None and len(killed) >= 5:
                # A live worker frozen past its lease, one holding rows in flight: the others'
                # rescuers take them; woken, it must neither send what it had not sent nor
                # record over the rescue.
                paused = pause_one_past_its_lease()
            # Never the paused one: killed, its rows would be explained by the kill, and what it
            # did once woken would go unchecked.
            victim = rng.choice([i for i, w in enumerate(workers) if w.pid != paused])
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait(10)
            killed.add(workers[victim].pid)
            workers[victim] = start()
        # No more kills: let the survivors finish and the rescuer clear what the dead left.
        wait_until(
            lambda: (
                rows(
                    db_url,
                    "SELECT count(*)::int AS n FROM steps_now WHERE status NOT IN ('accepted', 'rejected', 'unknown')",
                )[0]["n"]
                == 0
            ),
            timeout=120,
            interval=0.5,
            what="every row settled",
        )
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            finally:
                w.kill()
                w.wait()
        log.close()

    delivered = smtp.by_message_id()
    status = {
        r["status"]: r["n"] for r in rows(db_url, "SELECT status, count(*)::int AS n FROM steps_now GROUP BY status")
    }
    unknown = rows(
        db_url,
        "SELECT s.id, s.message_id, s.reason, e.detail ->> 'lease_owner' AS owner FROM steps_now s "
        "LEFT JOIN evidence e ON e.step_id = s.id AND e.kind = 'lease_expired' WHERE s.status = 'unknown'",
    )
    # A live worker whose server said nothing within EVQ_SMTP_TIMEOUT after the final '.'
    # (a loaded machine starves the test's server too), or whose adapter gave no answer by
    # the send's deadline (no phase: the executor's backstop), cannot tell either: it records
    # the unknown itself, with the phase and the timeout as its evidence.
    timed_out = {
        r["id"]
        for r in rows(
            db_url,
            "SELECT step_id AS id FROM evidence WHERE kind = 'provider_response' AND outcome = 'unknown' "
            "AND reason = 'ambiguous_response' AND coalesce(detail ->> 'phase', 'final') = 'final' "
            "AND detail ->> 'error_class' IN ('TimeoutError', 'DeadlineExceeded')",
        )
    }
    rescues = rows(
        db_url, "SELECT step_id AS id, detail ->> 'lease_owner' AS owner FROM evidence WHERE kind = 'lease_expired'"
    )
    # Answers (or "not sent") a worker recorded after its lease had gone: it lived on.
    came_back = {
        r["id"] for r in rows(db_url, "SELECT DISTINCT step_id AS id FROM evidence WHERE kind = 'late_response'")
    }
    unknown_delivered = sum(1 for u in unknown if u["message_id"] in delivered)
    print(
        f"\nchaos: {SENDS} sends, {len(killed)} workers killed | accepted {status.get('accepted', 0)}, "
        f"unknown {status.get('unknown', 0)} (of which the server had {unknown_delivered}; "
        f"{len(timed_out)} timed out after the final '.'), "
        f"rejected {status.get('rejected', 0)} | messages received {sum(delivered.values())}, "
        f"distinct {len(delivered)}, duplicates {sum(n - 1 for n in delivered.values())}"
    )
    assert killed and paused is not None and paused not in killed
    # Never killed, so a rescue of its rows can only be its pause outliving the lease.
    taken = {r["id"] for r in rescues if int(r["owner"].split(":")[1]) == paused}
    assert taken, "the paused worker's leases did not run out: the pause tested nothing"
    # Woken, it recorded what became of each of its rescued rows as a late answer (sent, or
    # abandoned unsent), never over the rescue.
    assert taken <= came_back, sorted(taken - came_back)[:5]
    assert max(delivered.values()) == 1, "a message was sent twice"
    assert set(status) <= {"accepted", "unknown"} and sum(status.values()) == SENDS

    # Every unknown row was in flight under a worker that was killed, or under one that lost
    # its lease while it lived and said so when it ran again (the rescue says whose it was),
    # or its own worker timed out waiting for the answer to the message.
    def explained(u: dict) -> bool:
        if not u["owner"]:
            return u["reason"] == "ambiguous_response" and u["id"] in timed_out
        return int(u["owner"].split(":")[1]) in killed or u["id"] in came_back

    unexplained = [u for u in unknown if not explained(u)]
    stories_of = rows(
        db_url,
        "SELECT step_id, kind, outcome, reason, detail::text FROM evidence WHERE step_id = ANY(%s) ORDER BY step_id, id",
        (sorted(u["id"] for u in unexplained[:3]),),
    )
    assert not unexplained, (unexplained[:5], stories_of, (tmp_path / "workers.log").read_text()[-3000:])
    # Every accepted row was received by the server, exactly once.
    accepted_ids = {r["message_id"] for r in rows(db_url, "SELECT message_id FROM steps_now WHERE status = 'accepted'")}
    assert accepted_ids <= set(delivered)
    # Evidence tells each story: one start per attempt, one answer or rescue per attempt.
    stories = rows(
        db_url,
        "SELECT s.status, count(*) FILTER (WHERE e.kind = 'attempt_started')::int AS started, "
        "count(*) FILTER (WHERE e.kind IN ('provider_response', 'lease_expired', 'attempt_released'))::int AS ended "
        "FROM email_steps s JOIN evidence e ON e.step_id = s.id GROUP BY s.id, s.status",
    )
    assert all(r["started"] == r["ended"] for r in stories)
