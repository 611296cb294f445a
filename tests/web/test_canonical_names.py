"""Every command is reachable by its canonical name on every interface it has: the HTTP API by
``operationId`` (/openapi.json), MCP by ``evq_<group>_<action>`` (tools/list), each called with
arguments built from the properties `evq schema --all` gives and nothing else. (On the command
line, tests/acceptance/test_schema_calls.py runs every tool at its ``cli_path``.) The commands
without an HTTP route or an MCP tool say why in ``interfaces.local_only``."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from evq.ops.cli import cli
from tests.acceptance.conftest import make_key
from tests.acceptance.test_schema_calls import value
from tests.web.support import checked, serving
from tests.web.test_mcp import call, client


def catalogue() -> list[dict[str, Any]]:
    done = CliRunner().invoke(cli, ["schema", "--all", "-o", "json"], catch_exceptions=False)
    tools = [t for g in json.loads(done.output)["data"]["groups"] for t in g["tools"]]
    return sorted(tools, key=lambda t: t["canonical_path"] != "steps.enqueue")  # a step to read back first


def json_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON a call needs, by each parameter's ``property``: the required ones and those whose
    condition holds. A parameter without a property is the command line's own, so never given here
    (a server's environment sets no default sender)."""
    params = tool["parameters"]
    given: set[str] = {"dry-run"} if tool["needs_confirmation"] else set()
    changed = True
    while changed:
        changed = False
        for key, p in params.items():
            cond = p.get("required_when")
            if key in given or p["property"] is None:
                continue
            if p["required"] or (cond and not any(k in given and params[k]["property"] for k in cond["unless_any"])):
                given.add(key)
                changed = True
    args: dict[str, Any] = {}
    for key in given:
        p = params[key]
        *parents, name = p["property"].split(".")
        into = args
        for parent in parents:
            into = into.setdefault(parent, {})
        into[name] = [value(p)] if p["multiple"] else value(p)
    return args


def test_every_http_command_answers_under_its_operation_id(db_url):
    admin = make_key(db_url, "root", "admin", created_by=None)
    tools = [t for t in catalogue() if t["interfaces"]["http"]]
    assert tools
    with serving(db_url) as served:
        http = served.client(admin)
        doc = http.get("/openapi.json").json()
        operations = {
            op["operationId"]: (method, path, op) for path, item in doc["paths"].items() for method, op in item.items()
        }
        for tool in tools:
            method, template, op = operations[tool["canonical_path"]]
            assert op["x-evq-command"] == tool["canonical_path"]
            args = json_arguments(tool)
            path = template.format(**{k: args.pop(k) for k in list(args) if "{" + k + "}" in template})
            query = {p["name"] for p in op.get("parameters", ()) if p["in"] == "query"}
            params = {k: args.pop(k) for k in list(args) if k in query}
            body = args if method == "post" else None
            answer = http.request(method.upper(), path, params=params, json=body)
            got = checked(answer)
            assert answer.status_code != 422, (tool["canonical_path"], path, params, body, got)
            if got["status"] == "error":
                assert got["error"]["code"] != "E_INVALID_ARG", (tool["canonical_path"], got)
                assert not got["error"]["message"].startswith("no route"), tool["canonical_path"]


async def test_every_mcp_command_answers_under_its_tool_name(db_url):
    import asyncio

    admin = await asyncio.to_thread(make_key, db_url, "root", "admin", created_by=None)
    tools = [t for t in catalogue() if t["interfaces"]["mcp"]]
    async with client(db_url, admin, mcp_resolve=True, mcp_approve=True) as c:
        listed = {t.name for t in (await c.list_tools()).tools}
        assert listed == {t["interfaces"]["mcp"] for t in tools}
        for tool in tools:
            body = await call(c, tool["interfaces"]["mcp"], json_arguments(tool), tool["canonical_path"])
            if body["status"] == "error":
                assert body["error"]["code"] != "E_INVALID_ARG", (tool["canonical_path"], body)


def test_the_commands_without_a_route_or_a_tool_say_why():
    for tool in catalogue():
        interfaces = tool["interfaces"]
        if not (interfaces["http"] and interfaces["mcp"]):
            assert interfaces["local_only"], tool["canonical_path"]
