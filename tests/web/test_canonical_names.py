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
    tools = [t for g in json.loads(done.output)["data"]["products"] for t in g["tools"]]
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
            arguments = json_arguments(tool)
            # A wait answers at its timeout, 30 s by default (28 s of this test, idle): its documented
            # example (2 s) is as much an answer under the tool's name, and the option given too.
            wait = tool["parameters"].get("timeout")
            if wait and wait["property"]:
                arguments[wait["property"]] = wait["example"]
            body = await call(c, tool["interfaces"]["mcp"], arguments, tool["canonical_path"])
            if body["status"] == "error":
                assert body["error"]["code"] != "E_INVALID_ARG", (tool["canonical_path"], body)


def test_the_commands_without_a_route_or_a_tool_say_why():
    for tool in catalogue():
        interfaces = tool["interfaces"]
        if not (interfaces["http"] and interfaces["mcp"]):
            assert interfaces["local_only"], tool["canonical_path"]


# -- every list's meta (the JSON contract: count, total, limit, offset) ------------------------

# The rows each list shows of what seed() made, by the JSON property its parameters are named by.
LIST_ARGUMENTS: dict[str, dict[str, Any]] = {
    "steps.list": {"run_id": "r-meta"},
    "runs.show": {"run_id": "r-meta"},  # a run, a page of its steps at a time
    "events.list": {"all_keys": True},
    "refusals.list": {},
    "deliveries.list": {"unmatched": True},
    "keys.list": {},
    "providers.list": {},  # every provider at once: not paged
}
SEEDED = {"steps.list": 3, "runs.show": 3, "events.list": 3, "refusals.list": 3, "deliveries.list": 3, "keys.list": 2}


def seed(db_url: str) -> str:
    """Three of each listed thing: steps of one run (unknown, so each is also an event of the
    feed), refused enqueues, unmatched delivery events; two keys. The admin key, to read them."""
    from tests.conformance.test_refusals import refusal
    from tests.support import unknown_steps, with_store
    from tests.web.test_deliveries_api import event, receive

    admin = make_key(db_url, "root", "admin", created_by=None)
    make_key(db_url, "bot", "agent")
    with_store(db_url, lambda store: unknown_steps(store, 3, run_id="r-meta"))
    for _ in range(3):
        with_store(db_url, lambda store: store.record_refusal(refusal()))
    receive(db_url, *(event(f"pm-meta-{i}", "bounced_hard", recipient=f"u{i}@example.org") for i in range(3)))
    return admin


def listed(path: str, data: Any) -> list[dict[str, Any]]:
    return data["steps"] if path == "runs.show" else data


def asks(tool: dict[str, Any]) -> list[dict[str, Any]]:
    """The calls :func:`check_pages` needs of a list: all of it, a page of one at offset 1, and the
    page past the end (one call for a list that is not paged)."""
    path, args = tool["canonical_path"], LIST_ARGUMENTS[tool["canonical_path"]]
    if "offset" not in {p["property"] for p in tool["parameters"].values()}:
        return [args]
    return [{**args, "limit": 100}, {**args, "limit": 1, "offset": 1}, {**args, "limit": 1, "offset": SEEDED[path]}]


def check_pages(tool: dict[str, Any], answers: list[dict[str, Any]]) -> None:
    """The answers to :func:`asks`, on one interface. Each meta says, as the contract has it, how
    many rows are shown (count), how many there are (total), the page's size (limit) and how many
    were skipped before it (offset); a page of one at offset 1 is the second row."""
    path = tool["canonical_path"]
    if len(answers) == 1:
        [body] = answers
        meta = body["meta"]
        assert (meta["count"], meta["total"], meta["limit"], meta["offset"]) == (len(body["data"]),) * 2 + (None, 0)
        return
    everything, page, past = answers
    rows, meta = listed(path, everything["data"]), everything["meta"]
    assert (meta["count"], meta["total"], meta["limit"], meta["offset"]) == (SEEDED[path], SEEDED[path], 100, 0), path
    assert len(rows) == SEEDED[path], path
    meta = page["meta"]
    assert (meta["count"], meta["total"], meta["limit"], meta["offset"]) == (1, SEEDED[path], 1, 1), (path, meta)
    assert meta.get("total_exact", True) is True
    ident = "name" if path == "keys.list" else "id"
    assert [r[ident] for r in listed(path, page["data"])] == [rows[1][ident]], path
    assert (past["meta"]["count"], past["meta"]["total"], listed(path, past["data"])) == (0, SEEDED[path], []), path


def command_line(tool: dict[str, Any], args: dict[str, Any]) -> list[str]:
    """The command line of a call, each argument under the flag its property belongs to."""
    by_property = {p["property"]: p for p in tool["parameters"].values()}
    argv = tool["cli_path"].split()
    for name, given in args.items():
        p = by_property[name]
        if p["kind"] == "argument":
            argv.append(str(given))
        elif p["kind"] == "flag":
            argv.append(p["flags"][-1])
        else:
            argv += [p["flags"][-1], str(given)]
    return argv


async def test_every_list_answers_with_count_total_limit_and_offset_on_every_interface(db_url):
    import asyncio

    from tests.acceptance.conftest import Evq

    lists = [t for t in catalogue() if t["name"] == "list" or t["canonical_path"] == "runs.show"]
    assert {t["canonical_path"] for t in lists} == set(LIST_ARGUMENTS)  # a new list is checked here too
    admin = await asyncio.to_thread(seed, db_url)

    def cli_and_http() -> None:
        for tool in lists:  # the command line, without a key: it reads every row
            check_pages(tool, [Evq(db_url).json(*command_line(tool, args)) for args in asks(tool)])
        with serving(db_url) as served:
            http = served.client(admin)
            for tool in [t for t in lists if t["interfaces"]["http"]]:
                template, answers = tool["interfaces"]["http"][0]["path"], []
                for args in asks(tool):
                    query = {k: ("true" if v is True else v) for k, v in args.items() if "{" + k + "}" not in template}
                    answer = http.get(template.format(**args), params=query)
                    assert answer.status_code == 200, answer.text
                    answers.append(checked(answer))
                check_pages(tool, answers)

    await asyncio.to_thread(cli_and_http)
    async with client(db_url, admin) as c:
        for tool in [t for t in lists if t["interfaces"]["mcp"]]:
            name, path = tool["interfaces"]["mcp"], tool["canonical_path"]
            check_pages(tool, [await call(c, name, args, path) for args in asks(tool)])
