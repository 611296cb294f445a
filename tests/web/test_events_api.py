"""The event feed and the actor over HTTP and MCP (issue 15): an agent that enqueued a
send learns of its rejection from its own feed, and the record names the key that asked."""

from __future__ import annotations

import asyncio

from evq.worker.outcomes import Rejected
from tests.acceptance.conftest import make_key
from tests.conformance.helpers import claim, settle
from tests.support import request, rows, with_store
from tests.web.support import checked, serving
from tests.web.test_mcp import call, client


def reject_all(db_url: str) -> None:
    """The worker's part, as the store records it: every pending step refused for good."""

    async def go(store):
        steps = await claim(store, now=None, limit=100)
        await store.record([settle(s, Rejected("550 no such user")) for s in steps], actor="worker-1")

    with_store(db_url, go)


def test_an_agent_reads_its_rejections_from_get_v1_events(db_url):
    make_key(db_url, "root", "admin", created_by=None)
    agent, other = make_key(db_url, "bot", "agent"), make_key(db_url, "bot-2", "agent")
    operator = make_key(db_url, "alice", "operator")
    with serving(db_url) as api:
        mine = checked(api.client(agent).post("/v1/steps", json=request(run_id="r-http")))["data"]
        checked(api.client(other).post("/v1/steps", json=request(run_id="r-other")))
        reject_all(db_url)
        feed = checked(api.client(agent).get("/v1/events", params={"since": 0}))
        assert [(e["kind"], e["step"], e["key_name"]) for e in feed["data"]] == [("rejected", mine["id"], "bot")]
        after = feed["meta"]["next_cursor"]
        assert checked(api.client(agent).get("/v1/events", params={"since": after}))["data"] == []
        refused = api.client(agent).get("/v1/events", params={"all_keys": "true"})
        assert refused.status_code == 403 and checked(refused)["error"]["code"] == "E_AUTH_FAILED"
        every = checked(api.client(operator).get("/v1/events", params={"all_keys": "true"}))["data"]
        assert {e["key_name"] for e in every} == {"bot", "bot-2"}
        theirs = checked(api.client(operator).get("/v1/events", params={"key": "bot-2"}))["data"]
        assert [e["run_id"] for e in theirs] == ["r-other"]
        shown = checked(api.client(agent).get(f"/v1/steps/{mine['id']}"))["data"]["decision"]
        assert (shown["actor"], shown["interface"]) == ("bot", "http")


async def test_an_agent_reads_its_rejections_from_the_mcp_tool(db_url):
    agent = await asyncio.to_thread(make_key, db_url, "bot", "agent", created_by=None)
    async with client(db_url, agent) as c:
        sent = await call(c, "evq_steps_enqueue", request(run_id="r-mcp"), "steps.enqueue")
        await asyncio.to_thread(reject_all, db_url)
        feed = await call(c, "evq_events_list", {"since": 0}, "events.list")
        assert [(e["kind"], e["step"]) for e in feed["data"]] == [("rejected", sent["data"]["id"])]
        refused = await call(c, "evq_events_list", {"all_keys": True}, "events.list")
        assert refused["error"]["code"] == "E_AUTH_FAILED"
    assert rows(db_url, "SELECT actor, interface FROM decisions") == [{"actor": "bot", "interface": "mcp"}]
