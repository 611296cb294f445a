"""One limit for a search, SEARCH_MAX (worker/search.py), stated and enforced the same on
every interface: the MCP tool's and the HTTP API's input schemas (maxLength), `evq schema`
and `evq steps list --help`, and a 321-character search refused with E_INVALID_ARG saying
the limit, by MCP, HTTP (`GET /v1/steps`, bulk `POST /v1/steps/resolve`) and the CLI."""

from __future__ import annotations

import json

from evq.ops.app.schemas import command_input
from evq.worker.search import SEARCH_MAX
from tests.acceptance.conftest import Evq, make_key
from tests.support import rows
from tests.web.support import checked, serving
from tests.web.test_mcp import call, client, key

TOO_LONG = "x" * (SEARCH_MAX + 1)
SAYS = f"at most {SEARCH_MAX} characters, got {SEARCH_MAX + 1}"


def _field(body: dict, name: str) -> dict:
    assert body["status"] == "error" and body["error"]["code"] == "E_INVALID_ARG", body
    [found] = [f for f in body["error"]["context"]["fields"] if f["field"] == name]
    return found


async def test_the_mcp_tool_states_search_max_and_refuses_one_character_more(db_url):
    assert SEARCH_MAX == 320
    admin = await key(db_url, "root", "admin", created_by=None)
    async with client(db_url, admin) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        search = tools["evq_steps_list"].input_schema["properties"]["search"]
        assert search["maxLength"] == SEARCH_MAX and f"At most {SEARCH_MAX} characters" in search["description"]
        assert checked_ok(await call(c, "evq_steps_list", {"search": "x" * SEARCH_MAX}, "steps.list"))
        refused = await call(c, "evq_steps_list", {"search": TOO_LONG}, "steps.list")
    assert _field(refused, "search")["message"] == SAYS


def checked_ok(body: dict) -> bool:
    return body["status"] == "success" and body["data"] == []


def test_the_http_api_states_search_max_and_refuses_one_character_more(db_url):
    with serving(db_url) as api:
        reader = api.client(make_key(db_url, "bot", "agent"))
        operator = api.client(make_key(db_url, "alice", "operator"))
        spec = reader.get("/openapi.json").json()
        [listed] = [p for p in spec["paths"]["/v1/steps"]["get"]["parameters"] if p["name"] == "search"]
        assert listed["schema"]["anyOf"][0]["maxLength"] == SEARCH_MAX
        [q] = [p for p in spec["paths"]["/v1/steps"]["get"]["parameters"] if p["name"] == "q"]
        assert q["schema"]["anyOf"][0]["maxLength"] == SEARCH_MAX
        assert checked(reader.get("/v1/steps", params={"search": "x" * SEARCH_MAX}))["data"] == []
        for name in ("search", "q"):
            too_long = reader.get("/v1/steps", params={name: TOO_LONG})
            assert too_long.status_code == 400  # a query parameter: 400, as the page's
            assert str(SEARCH_MAX) in _field(checked(too_long), name)["message"]
        body = {"status": ["unknown"], "search": TOO_LONG, "as": "accepted", "note": "n", "dry_run": True}
        bulk = operator.post("/v1/steps/resolve", json=body)
        assert bulk.status_code == 422 and _field(checked(bulk), "search")["message"] == SAYS
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0


def test_the_cli_states_search_max_and_refuses_one_character_more(db_url):
    evq = Evq(db_url)
    assert command_input("steps.list")["properties"]["search"]["maxLength"] == SEARCH_MAX
    helped = evq.run("steps", "list", "--help")
    assert helped.returncode == 0 and f"At most {SEARCH_MAX} characters" in " ".join(helped.stdout.split())
    described = evq.json("schema", "steps", "list")["data"]
    assert described["parameters"]["search"]["max_length"] == SEARCH_MAX
    refused = evq.run("steps", "list", "--search", TOO_LONG, "-o", "json")
    assert refused.returncode == 2, refused.stdout
    assert _field(json.loads(refused.stdout), "--search")["message"] == SAYS
    table = evq.run("steps", "list", "--search", TOO_LONG)
    assert table.returncode == 2 and SAYS in table.stdout + table.stderr
