"""The approval policy over HTTP, the real app on a loopback port: a held send's answer says
why, `GET /v1/policy` shows the policy and the budgets' use, and a refusal over a budget is
E_BUDGET (HTTP 422) recorded as a refused enqueue. Every body is checked against its schema."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.acceptance.conftest import make_key
from tests.support import request, rows
from tests.web.support import checked, serving


def test_a_send_to_a_new_recipient_is_held_and_says_why(db_url):
    agent_key = make_key(db_url, "bot", "agent")
    with serving(db_url, approval_first_contact="address") as api:
        agent = api.client(agent_key)
        later = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0).isoformat()
        asked = request(run_id="r", step_id="hello", to=["new@example.com"], priority="high", send_at=later)
        preview = checked(agent.post("/v1/steps", json=asked, params={"dry_run": "true"}))["data"]["plan"][0]
        assert preview["action"] == "create" and preview["hold"]["rules"][0]["rule"] == "first_contact"
        made = agent.post("/v1/steps", json=asked)
        assert made.status_code == 201
        step = checked(made)["data"]
        assert step["status"] == "held" and step["hold"]["rules"][0]["recipients"] == ["new@example.com"]
        again = agent.post("/v1/steps", json=asked)
        assert again.status_code == 200 and checked(again)["data"] == {**step, "created": False}
        policy = checked(agent.get("/v1/policy"))["data"]
        assert (policy["first_contact"], policy["active"], policy["usage"]) == ("address", True, [])
    [row] = rows(db_url, "SELECT status, priority, send_at FROM steps_now")
    assert (row["status"], row["priority"]) == ("held", 1) and row["send_at"].isoformat() == later
    [held] = rows(db_url, "SELECT kind, actor FROM evidence")
    assert (held["kind"], held["actor"]) == ("held", "bot")


def test_over_a_budget_in_refuse_mode_is_e_budget_recorded_as_a_refusal(db_url):
    agent_key = make_key(db_url, "bot", "agent")
    with serving(db_url, budget_run_recipients="1", budget_action="refuse") as api:
        agent = api.client(agent_key)
        assert agent.post("/v1/steps", json=request(run_id="r", step_id="one")).status_code == 201
        over = agent.post("/v1/steps", json=request(run_id="r", step_id="two"))
        assert over.status_code == 422
        error = checked(over)["error"]
        assert error["code"] == "E_BUDGET"
        assert error["context"]["fields"][0]["field"] == "budget.run_recipients"
        [refusal] = checked(agent.get("/v1/refusals"))["data"]
        assert refusal["interface"] == "http" and refusal["key_name"] == "bot"
        assert refusal["errors"][0]["field"] == "budget.run_recipients"
        usage = checked(agent.get("/v1/policy"))["data"]["usage"]
        assert [(u["budget"], u["scope"], u["used"], u["cap"]) for u in usage] == [("run_recipients", "r", 1, 1)]
    assert [r["step_id"] for r in rows(db_url, "SELECT step_id FROM steps_now")] == ["one"]
