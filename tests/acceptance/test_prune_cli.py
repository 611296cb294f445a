"""`evq prune` end to end: dry run, the real thing, and its log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta

import psycopg
import pytest

from tests import contract
from tests.acceptance.conftest import Evq, make_key, smtp_env
from tests.support import request, rows, wait_until


def test_prune_dry_run_then_prune(evq: Evq, db_url, tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(request(run_id="old", provider="null")) for _ in range(3)))
    evq.json("enqueue", "--file", str(path))
    done = evq.run("worker", "run", "--drain", EVQ_ADAPTER="null")
    assert done.returncode == 0, done.stderr[-2000:]
    # Nothing is 90 days old yet.
    assert evq.json("prune", "--older-than", "90d")["data"]["steps"] == 0
    # Age the history (steps carry their own times; evidence keeps its own).
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "UPDATE email_steps SET created_at = now() - interval '100 days', closed_at = now() - interval '100 days'"
        )

        # Blast-radius counters: run "old"'s (it goes with its steps), an hour long over, the
        # current hour, a run with no step that something charged since the cutoff (an enqueue
        # that has not committed its step yet), and a budget this evq does not know (kept,
        # whatever its age).
        conn.execute(
            "INSERT INTO send_budgets (budget, scope, window_start, used, updated_at) VALUES "
            "('run_recipients', 'old', 'epoch', 3, now() - interval '100 days'), "
            "('domain_hourly', 'example.com', date_trunc('hour', now() - interval '100 days'), 3, "
            " now() - interval '100 days'), "
            "('domain_hourly', 'example.com', date_trunc('hour', now()), 1, now()), "
            "('run_recipients', 'fresh', 'epoch', 1, now()), "
            "('some_later_budget', 'x', 'epoch', 1, now() - interval '100 days')"
        )

    dry = evq.json("prune", "--older-than", "90d", "--dry-run")["data"]
    assert (dry["dry_run"], dry["steps"], dry["evidence"], dry["decisions"]) == (True, 3, 6, 3)
    # The run's counter is not counted: its steps are still there when a dry run looks.
    assert dry["budgets"] == 1
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 3
    assert rows(db_url, "SELECT count(*) AS n FROM send_budgets")[0]["n"] == 5

    done = evq.run("prune", "--older-than", "90d", "--batch-size", "2", "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)["data"]
    assert (data["steps"], data["evidence"], data["decisions"], data["batches"]) == (3, 6, 3, 2)
    assert data["budgets"] == 2
    assert "prune: 2 batches, 3 steps" in done.stderr  # progress on stderr
    assert "2 budget counters deleted" in done.stderr
    kept = rows(db_url, "SELECT budget, scope FROM send_budgets ORDER BY 1, 2")
    assert [(r["budget"], r["scope"]) for r in kept] == [
        ("domain_hourly", "example.com"),
        ("run_recipients", "fresh"),
        ("some_later_budget", "x"),
    ]
    assert rows(db_url, "SELECT count(*) AS n FROM evidence")[0]["n"] == 0
    log = rows(db_url, "SELECT batch, steps, actor FROM prune_log ORDER BY batch")
    assert [(r["batch"], r["steps"]) for r in log] == [(1, 2), (2, 1)] and log[0]["actor"] == "test-admin"


def test_prune_needs_a_positive_duration_and_an_admin_key(evq: Evq, db_url):
    assert evq.json("prune", "--older-than", "soon", expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert evq.json("prune", "--older-than", "0d", expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert Evq(db_url).json("prune", "--older-than", "90d", expect=4)["error"]["code"] == "E_AUTH_FAILED"
    agent = make_key(db_url, "an-agent", "agent", created_by="test-admin")
    assert Evq(db_url, api_key=agent).json("prune", "--older-than", "90d", expect=4)["error"]["code"] == "E_AUTH_FAILED"
    # Counting needs no key.
    assert Evq(db_url).json("prune", "--older-than", "90d", "--dry-run")["data"]["dry_run"] is True


# Loaded by every Python process started with this folder first on PYTHONPATH: the
# process's clock (time.time, datetime.now/utcnow/today) runs a year ahead of the
# machine's, as on a client with a badly set clock. The database keeps its own.
CLOCK_A_YEAR_AHEAD = """
import datetime as _dt
import time as _time

_SHIFT = 365 * 86400
_real_time = _time.time
_real_datetime = _dt.datetime
_time.time = lambda: _real_time() + _SHIFT


class _Meta(type):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _real_datetime)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _real_datetime)


class _AheadDatetime(_real_datetime, metaclass=_Meta):
    @classmethod
    def now(cls, tz=None):
        return _real_datetime.now(tz) + _dt.timedelta(seconds=_SHIFT)

    @classmethod
    def utcnow(cls):
        return _real_datetime.utcnow() + _dt.timedelta(seconds=_SHIFT)

    @classmethod
    def today(cls):
        return cls.now()


_dt.datetime = _AheadDatetime
"""


def drained(evq: Evq, tmp_path, n: int = 3) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(request(run_id="fresh", provider="null")) for _ in range(n)))
    evq.json("enqueue", "--file", str(path))
    done = evq.run("worker", "run", "--drain", EVQ_ADAPTER="null")
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_client_clock_a_year_ahead_prunes_nothing_recent(evq: Evq, db_url, tmp_path):
    drained(evq, tmp_path)  # three steps closed seconds ago
    ahead = tmp_path / "clock-ahead"
    ahead.mkdir()
    (ahead / "sitecustomize.py").write_text(CLOCK_A_YEAR_AHEAD)
    env = {"PYTHONPATH": os.pathsep.join([str(ahead), os.environ.get("PYTHONPATH", "")])}
    check = subprocess.run(
        [sys.executable, "-c", "import datetime; print(datetime.datetime.now().year)"],
        capture_output=True,
        text=True,
        env={**evq.env, **env},
        timeout=30,
    )
    assert int(check.stdout) >= datetime.now().year + 1, (check.stdout, check.stderr)  # the fake clock is in place

    db_now = rows(db_url, "SELECT now() AS n")[0]["n"]
    done = evq.run("prune", "--older-than", "1d", "-o", "json", **env)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)["data"]
    assert (data["steps"], data["evidence"], data["decisions"]) == (0, 0, 0)
    # The cutoff is the database's now() minus a day, not the client's.
    cutoff = datetime.fromisoformat(data["cutoff"])
    assert abs(cutoff - (db_now - timedelta(days=1))) < timedelta(minutes=10)
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now WHERE status = 'accepted'")[0]["n"] == 3
    assert rows(db_url, "SELECT count(*) AS n FROM prune_log")[0]["n"] == 0


def test_an_ambiguous_unit_is_refused_and_deletes_nothing(evq: Evq, db_url, tmp_path):
    drained(evq, tmp_path)
    with psycopg.connect(db_url) as conn:  # closed two minutes ago: "1m" as a minute would delete them
        conn.execute(
            "UPDATE email_steps SET created_at = now() - interval '2 minutes', closed_at = now() - interval '2 minutes'"
        )
    for ambiguous in ("1m", "1 m", "3M"):
        error = evq.json("prune", "--older-than", ambiguous, expect=2)["error"]
        assert error["code"] == "E_INVALID_ARG" and "min" in error["message"] and "mo" in error["message"], error
        assert evq.json("prune", "--older-than", ambiguous, "--dry-run", expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 3
    # The units say what they mean: a month keeps them, a minute (spelled out) does not.
    assert evq.json("prune", "--older-than", "1mo")["data"]["steps"] == 0
    assert evq.json("prune", "--older-than", "1min")["data"]["steps"] == 3
    for fine in ("90d", "2w", "1y", "12h", "6mo"):
        assert evq.json("prune", "--older-than", fine, "--dry-run")["data"]["dry_run"] is True
    assert "min" in evq.run("prune", "--help").stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_the_first_interrupt_commits_the_batch_in_progress_and_answers_e_aborted(evq: Evq, db_url, sig):
    """Long work's rule (ops/app/longwork.py): a real signal to a real `evq prune -o json`
    mid-run; the batches done are committed and logged, the answer says what they were."""
    with psycopg.connect(db_url) as conn:
        conn.execute(
            """
            INSERT INTO decisions (id, run_id, step_id) SELECT g, 'r', 's' || g FROM generate_series(1, 20000) g;
            INSERT INTO email_steps (run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                                     payload_sha256, status, closed_at, attempts, first_attempt_at, created_at)
            SELECT 'r', 's' || g, g, 'k' || g, '<m' || g || '@x>', 'smtp', '{}', repeat('a', 64), 'accepted',
                   now() - interval '100 days', 1, now() - interval '100 days', now() - interval '100 days'
            FROM generate_series(1, 20000) g;
            """
        )
    proc = evq.popen("prune", "--older-than", "90d", "--batch-size", "20", "-o", "json")
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("prune: ") and "batches" in line:
                break  # a batch is committed: the prune is under way
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 7, (proc.returncode, stdout, stderr[-2000:])
    out = json.loads(stdout)
    contract.check(("prune",), out)
    assert out["error"]["code"] == "E_ABORTED"
    done = out["error"]["context"]
    left = rows(db_url, "SELECT count(*)::int AS n FROM steps_now")[0]["n"]
    logged = rows(db_url, "SELECT count(*)::int AS batches, coalesce(sum(steps), 0)::int AS steps FROM prune_log")[0]
    assert 0 < done["steps"] < 20000 and left == 20000 - done["steps"]
    assert logged == {"batches": done["batches"], "steps": done["steps"]}
    assert done["decisions"] == done["steps"] and done["dry_run"] is False


def test_a_send_retried_after_prune_is_answered_as_it_ended_and_never_sent_again(db_url, admin_key, smtp):
    """The issue's case, every command a real `evq` child process and a real SMTP server counting
    what arrives: an agent's send is accepted, `evq steps prune --older-than 1s` removes it, the
    agent retries the same request. The retry is answered as the step ended (its id, its
    Message-ID, accepted, pruned, nothing to do), the next drain sends nothing, and the recipient
    has exactly one message."""
    evq = Evq(db_url, api_key=admin_key, process=True)
    asked = json.dumps(request(run_id="run-9", step_id="welcome", provider="smtp"))
    first = evq.json("steps", "enqueue", "--file", "-", input=asked)["data"]
    assert first["created"] is True
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    assert smtp.by_message_id() == {first["message_id"]: 1}
    # Closed more than a second ago on the database's clock (the prune's cutoff is its now() - 1s).
    wait_until(
        lambda: rows(db_url, "SELECT closed_at < now() - interval '1.1 seconds' AS old FROM steps_now")[0]["old"],
        what="the step to be closed more than a second ago",
    )
    pruned = evq.json("steps", "prune", "--older-than", "1s")["data"]
    assert pruned["steps"] == 1 and rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0

    again = evq.json("steps", "enqueue", "--file", "-", input=asked)["data"]
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(smtp.messages) == 1 and smtp.by_message_id() == {first["message_id"]: 1}
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
    assert (again["id"], again["message_id"], again["created"]) == (first["id"], first["message_id"], False)
    assert (again["status"], again["pruned"], again["next_action"]) == ("accepted", True, "none")
    told = evq.run("steps", "enqueue", "--file", "-", input=asked)  # the people's output says so too
    assert told.returncode == 0 and "already enqueued" in told.stdout and "removed by evq prune" in told.stdout

    # The same key with another request is refused, as for a stored step; nothing is written.
    changed = json.dumps({**json.loads(asked), "subject": "something else"})
    refused = evq.json("steps", "enqueue", "--file", "-", input=changed, expect=3)["error"]
    assert refused["code"] == "E_CONFLICT" and refused["context"]["pruned"] is True
    # The step's id says it was pruned, and how it ended.
    gone = evq.json("steps", "show", str(first["id"]), expect=1)["error"]
    assert gone["code"] == "E_NOT_FOUND" and "pruned" in gone["message"]
    assert (gone["context"]["pruned"], gone["context"]["status"]) == (True, "accepted")
    assert gone["context"]["message_id"] == first["message_id"]
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0 and len(smtp.messages) == 1
