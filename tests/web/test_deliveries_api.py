"""`deliveries list` over HTTP, MCP and the command line, and a step's delivery state on the
ops page (issue 16, part A): an operator lists unmatched events; an agent reads only the events
of a step it enqueued; the page's step view and trace show the latest delivery state."""

from __future__ import annotations

import asyncio
import json
import re

import httpx

from evq.ops.app import service
from evq.worker.delivery import DeliveryEvent
from tests.acceptance.conftest import Evq, make_key
from tests.support import request, serve_process, step_row, unknown_steps, with_store
from tests.web.support import checked, serving
from tests.web.test_mcp import call, client
from tests.web.test_ops_page import _signed_in


def receive(db_url: str, *events: DeliveryEvent) -> service.Reply:
    return with_store(db_url, lambda store: service.receive_deliveries(store, "postmark", list(events), ("smtp",)))


def event(event_id: str, kind: str = "delivered", **kw) -> DeliveryEvent:
    return DeliveryEvent(provider="postmark", event_id=event_id, type=kind, **kw)


def test_operators_list_unmatched_events_and_agents_only_their_own_steps(db_url):
    make_key(db_url, "root", "admin", created_by=None)
    agent, other = make_key(db_url, "bot", "agent"), make_key(db_url, "bot-2", "agent")
    operator = make_key(db_url, "alice", "operator")
    with serving(db_url) as api:
        mine = checked(api.client(agent).post("/v1/steps", json=request(run_id="r-d")))["data"]
        mid = step_row(db_url, mine["id"])["message_id"]
        receive(db_url, event("pm-1", message_id=mid), event("pm-2", "bounced_hard", recipient="gone@example.org"))

        unmatched = checked(api.client(operator).get("/v1/deliveries", params={"unmatched": "true"}))
        assert [(d["event_id"], d["step"]) for d in unmatched["data"]] == [("pm-2", None)]
        every = checked(api.client(operator).get("/v1/deliveries", params={"provider": "postmark"}))["data"]
        assert [d["event_id"] for d in every] == ["pm-2", "pm-1"]
        own = checked(api.client(agent).get("/v1/deliveries", params={"step": mine["id"]}))["data"]
        assert [(d["event_id"], d["step"], d["run_id"]) for d in own] == [("pm-1", mine["id"], "r-d")]
        for key, params in ((agent, {"unmatched": "true"}), (other, {"step": mine["id"]}), (agent, {})):
            refused = api.client(key).get("/v1/deliveries", params=params)
            assert refused.status_code == 403 and checked(refused)["error"]["code"] == "E_AUTH_FAILED"
        wrong = api.client(operator).get("/v1/deliveries", params={"unmatched": "true", "step": mine["id"]})
        assert wrong.status_code == 400 and checked(wrong)["error"]["code"] == "E_INVALID_ARG"
        shown = checked(api.client(agent).get(f"/v1/steps/{mine['id']}"))["data"]
        assert shown["step"]["delivery"]["state"] == "delivered" and shown["deliveries"][0]["event_id"] == "pm-1"
        listed = checked(api.client(agent).get("/v1/steps", params={"run_id": "r-d"}))["data"]
        assert listed[0]["delivery"]["events"] == 1


def test_the_command_line_lists_deliveries(db_url):
    receive(db_url, event("pm-9", "complained", message_id="<lost@example.org>"))
    out = Evq(db_url).json("deliveries", "list", "--unmatched")
    assert [(d["event_id"], d["type"]) for d in out["data"]] == [("pm-9", "complained")]
    text = Evq(db_url).run("deliveries", "list")
    assert "pm-9" not in text.stdout and "complained" in text.stdout and "none" in text.stdout


async def test_the_mcp_tool_lists_deliveries(db_url):
    operator = await asyncio.to_thread(make_key, db_url, "alice", "operator", created_by=None)
    await asyncio.to_thread(receive, db_url, event("pm-m", message_id="<nobody@example.org>"))
    async with client(db_url, operator) as c:
        got = await call(c, "evq_deliveries_list", {"unmatched": True}, "deliveries.list")
        assert [d["event_id"] for d in got["data"]] == ["pm-m"]
        bad = await call(c, "evq_deliveries_list", {"limit": 0}, "deliveries.list")
        assert bad["error"]["code"] == "E_INVALID_ARG"


def test_the_ops_page_shows_a_steps_delivery_state_and_events(db_url):
    key = make_key(db_url, "root", "admin", created_by=None)
    made = Evq(db_url, api_key=key).json("steps", "enqueue", "--file", "-", input=json.dumps(request(run_id="r-page")))[
        "data"
    ]
    receive(db_url, event("pm-p", "bounced_soft", message_id=step_row(db_url, made["id"])["message_id"]))
    with serve_process(db_url) as served, httpx.Client(base_url=served.url, timeout=30) as web:
        _signed_in(web, key)
        step = web.get(f"/ops/steps/{made['id']}").text
        trace = web.get("/ops/runs/r-page").text
    assert re.search(r'<dd id="delivery"><span class="delivery delivery-bounced_soft">bounced_soft</span>', step)
    assert "pm-p" in re.search(r'<table class="rows" id="deliveries">.*?</table>', step, flags=re.S)[0]
    steps = re.search(r'<table class="rows" id="run-steps">.*?</table>', trace, flags=re.S)[0]
    assert "bounced_soft" in steps
    assert '<tr class="kind-delivery_event">' in trace


def test_the_command_lines_tables_show_the_delivery_state(db_url):
    [made] = with_store(db_url, lambda store: unknown_steps(store, run_id="r-cli"))
    mid = step_row(db_url, made.id)["message_id"]
    receive(db_url, event("pm-c", "deferred", message_id=mid, recipient="ada@example.org"))
    listed = Evq(db_url).run("steps", "list", "--run-id", "r-cli").stdout
    assert re.search(rf"^{made.id}\s+accepted\b.*\bdeferred\s*$", listed, flags=re.M), listed
    shown = Evq(db_url).run("steps", "show", str(made.id)).stdout
    assert "delivery        deferred" in shown and "pm-c" not in shown and "ada@example.org" in shown
    assert "deferred" in Evq(db_url).run("runs", "show", "r-cli").stdout
