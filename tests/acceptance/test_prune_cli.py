"""`evq prune` end to end: dry run, the real thing, and its log."""

from __future__ import annotations

import json

import psycopg

from tests.acceptance.conftest import Evq, make_key
from tests.support import request, rows


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
        conn.execute("UPDATE email_steps SET created_at = now() - interval '100 days', closed_at = now() - interval '100 days'")

    dry = evq.json("prune", "--older-than", "90d", "--dry-run")["data"]
    assert (dry["dry_run"], dry["steps"], dry["evidence"], dry["decisions"]) == (True, 3, 6, 3)
    assert rows(db_url, "SELECT count(*) AS n FROM email_steps")[0]["n"] == 3

    done = evq.run("prune", "--older-than", "90d", "--batch-size", "2", "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)["data"]
    assert (data["steps"], data["evidence"], data["decisions"], data["batches"]) == (3, 6, 3, 2)
    assert "prune: 2 batches, 3 steps" in done.stderr  # progress on stderr
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
