"""The approval policy on the command line: the enqueue flags, a held send's answer, the
policy's view, and a budget refusal's exit code (E_BUDGET, 2) recorded as a refused enqueue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.acceptance.conftest import Evq
from tests.support import rows

FLAGS = ("--from", "agent@example.org", "--subject", "Code", "--text", "123456")


def test_flags_hold_schedule_and_prioritise_a_send(evq: Evq, db_url):
    later = (datetime.now(UTC) + timedelta(days=1)).replace(microsecond=0).isoformat()
    args = ("enqueue", "--run-id", "r", "--step-id", "code", "--to", "bob@example.com", *FLAGS)
    out = evq.json(*args, "--require-approval", "--send-at", later, "--priority", "high")["data"]
    assert out["status"] == "held" and [r["rule"] for r in out["hold"]["rules"]] == ["requested"]
    [row] = rows(db_url, "SELECT status, priority, send_at, next_attempt_at FROM steps_now")
    assert (row["status"], row["priority"]) == ("held", 1)
    assert row["send_at"] == row["next_attempt_at"] and row["send_at"].isoformat() == later
    human = evq.run("enqueue", "--run-id", "r", "--step-id", "code", "--to", "bob@example.com", *FLAGS,
                    "--require-approval", "--send-at", later, "--priority", "high")  # fmt: skip
    assert "held for approval" in human.stdout and "requested" in human.stdout
    bad = evq.json(*args[:4], "other", *args[5:], "--priority", "urgent", expect=2)
    assert bad["error"]["code"] == "E_INVALID_ARG"


def test_policy_show_and_a_budget_refusal(evq: Evq, db_url):
    env = {"EVQ_BUDGET_RUN_RECIPIENTS": "1", "EVQ_BUDGET_ACTION": "refuse"}
    ok = evq.json("enqueue", "--run-id", "r", "--step-id", "a", "--to", "a@example.com", *FLAGS, **env)["data"]
    assert ok["status"] == "pending" and ok["hold"] is None
    refused = evq.json("enqueue", "--run-id", "r", "--step-id", "b", "--to", "b@example.com", *FLAGS, expect=2, **env)
    assert refused["error"]["code"] == "E_BUDGET"
    [refusal] = rows(db_url, "SELECT interface, errors FROM enqueue_refusals")
    assert refusal["interface"] == "cli" and refusal["errors"][0]["field"] == "budget.run_recipients"
    shown = evq.json("policy", "show", **env)["data"]
    assert shown["budgets"] == [{"budget": "run_recipients", "cap": 1}] and shown["over_budget"] == "refuse"
    assert [(u["scope"], u["used"], u["cap"]) for u in shown["usage"]] == [("r", 1, 1)]
    assert "run_recipients" in evq.run("policy", "show", **env).stdout
