"""An agent with only MCP: the SDK's in-process client against evq's MCPServer (and, once,
`evq mcp` over real stdio): list the tools, check their schemas, send, read back, and
get the contract's error codes for refused calls."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from evq.adapters.postgres.health import PostgresHealth
from evq.adapters.postgres.store import PostgresStore
from evq.ops.app.schemas import command_input, request_schema
from evq.ops.mcp.server import build_server
from evq.ops.settings import Settings
from tests import contract
from tests.acceptance.conftest import make_key
from tests.support import accepted_step, execute, prune_closed, request, rows, step_row, unknown_steps


async def key(db_url: str, name: str, role: str, *, created_by: str | None) -> str:
    return await asyncio.to_thread(make_key, db_url, name, role, created_by=created_by)


@asynccontextmanager
async def client(db_url: str, key: str | None, **settings: Any) -> AsyncIterator[Client]:
    store = await PostgresStore.open(db_url, max_size=2)
    try:
        server = build_server(
            store, Settings.load(env={}, database_url=db_url, **settings), key, health=PostgresHealth(db_url)
        )
        async with Client(server) as connected:
            yield connected
    finally:
        await store.close()


async def call(client: Client, tool: str, arguments: dict[str, Any], command: str) -> dict[str, Any]:
    """The tool's result: the contract's wrapper (also the text content), checked against the command's schema."""
    import json

    result = await client.call_tool(tool, arguments)
    body = result.structured_content
    assert body is not None and json.loads(result.content[0].text) == body
    assert result.is_error == (body["status"] == "error")
    contract.check(tuple(command.split(".")), body)
    return body


async def test_tools_and_their_schemas_come_from_the_cli_definitions(db_url):
    async with client(db_url, None) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert set(tools) == {
        "evq_steps_enqueue",
        "evq_steps_show",
        "evq_steps_wait",
        "evq_steps_list",
        "evq_runs_show",
        "evq_providers_list",
        "evq_policy_show",
        "evq_admin_health",
        "evq_events_list",
        "evq_deliveries_list",
        "evq_steps_cancel",
    }  # approve and deny only with EVQ_MCP_TOOLS=approve (test_an_agent_over_mcp_never_approves...)
    assert tools["evq_events_list"].input_schema == command_input("events.list")
    assert tools["evq_deliveries_list"].input_schema == command_input("deliveries.list")
    send = tools["evq_steps_enqueue"].input_schema
    assert {k: v for k, v in send["properties"].items() if k != "dry_run"} == request_schema()["properties"]
    assert send["additionalProperties"] is False and "api_key" not in send["properties"]
    assert tools["evq_steps_list"].input_schema == command_input("steps.list")
    listed = tools["evq_steps_list"].input_schema["properties"]
    assert listed["limit"]["maximum"] == 1000 and listed["older_than"]["description"].startswith("Only rows older")
    assert tools["evq_runs_show"].input_schema["required"] == ["run_id"]
    assert tools["evq_steps_show"].input_schema["properties"] == {
        "step_id": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
    }
    assert tools["evq_steps_show"].annotations.read_only_hint is True
    assert tools["evq_steps_enqueue"].output_schema["oneOf"]  # the docs/cli-schema file, self-contained


async def test_every_tool_carries_the_hints_its_command_table_entry_implies(db_url):
    """readOnlyHint for reads; the send tool destructive (an email cannot be unsent), idempotent
    (the same key is the same step) and open world; `steps resolve` destructive, not idempotent
    (a bulk close repeated may close rows that became unknown since)."""
    from evq.ops.app.commands import COMMANDS, Effect

    async with client(db_url, None, mcp_resolve=True, mcp_approve=True) as c:
        tools = {t.name: t.annotations for t in (await c.list_tools()).tools}
    by_tool = {entry.mcp_tool: entry for entry in COMMANDS.values() if entry.mcp}
    assert set(tools) == set(by_tool)
    for name, hints in tools.items():
        assert hints is not None, name
        read = by_tool[name].effect is Effect.READ
        assert hints.read_only_hint is read, name
        assert hints.title == f"evq {by_tool[name].words}"
        if read:
            assert (hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint) == (False, True, False), name
    send = tools["evq_steps_enqueue"]
    assert (send.read_only_hint, send.destructive_hint, send.idempotent_hint, send.open_world_hint) == (
        False,
        True,
        True,
        True,
    )
    resolve = tools["evq_steps_resolve"]
    assert (resolve.read_only_hint, resolve.destructive_hint, resolve.idempotent_hint) == (False, True, False)
    assert resolve.open_world_hint is False  # it changes evq's rows only
    assert tools["evq_steps_wait"].read_only_hint is True


async def test_evq_steps_wait_answers_when_the_step_is_worth_acting_on(db_url, store):
    """An unknown step through smtp (no dedupe, no lookup, no webhook by default) needs an operator:
    the wait answers at once. A pending step nobody sends waits out its timeout."""
    [lost] = await unknown_steps(store, run_id="run-wait")
    agent = await key(db_url, "bot", "agent", created_by=None)
    async with client(db_url, agent) as c:
        now = await call(c, "evq_steps_wait", {"step_id": lost.id, "timeout": "20s"}, "steps.wait")
        step = now["data"]["step"]
        assert (step["status"], step["next_action"], step["safe_to_retry"]) == ("unknown", "ask_operator", False)
        assert now["meta"]["timed_out"] is False and now["meta"]["waited_ms"] < 10_000
        sent = await call(c, "evq_steps_enqueue", request(run_id="run-wait", step_id="b"), "steps.enqueue")
        assert (sent["data"]["next_action"], sent["data"]["safe_to_retry"]) == ("wait", False)
        late = await call(c, "evq_steps_wait", {"step_id": sent["data"]["id"], "timeout": "300ms"}, "steps.wait")
        assert late["meta"]["timed_out"] is True and late["data"]["step"]["next_action"] == "wait"
        assert late["meta"]["waited_ms"] >= 300
        bad = await call(c, "evq_steps_wait", {"step_id": lost.id, "timeout": "2h"}, "steps.wait")
        assert bad["error"]["code"] == "E_INVALID_ARG" and bad["error"]["context"]["fields"][0]["field"] == "timeout"


async def test_an_agent_with_only_mcp_sends_once_and_follows_it(db_url):
    agent = await key(db_url, "bot", "agent", created_by=None)
    sent = request(run_id="run-mcp", step_id="hello")
    async with client(db_url, agent) as c:
        first = await call(c, "evq_steps_enqueue", sent, "steps.enqueue")
        assert first["status"] == "success" and first["data"]["created"] is True
        again = await call(c, "evq_steps_enqueue", sent, "steps.enqueue")
        assert again["data"] == {**first["data"], "created": False}
        step_id = first["data"]["id"]
        shown = await call(c, "evq_steps_show", {"step_id": step_id}, "steps.show")
        assert shown["data"]["step"]["status"] == "pending" and shown["data"]["decision"]["intent"] == sent["intent"]
        trace = await call(c, "evq_runs_show", {"run_id": "run-mcp"}, "runs.show")
        assert [e["kind"] for e in trace["data"]["events"]] == ["decision", "enqueued"]
        listed = await call(c, "evq_steps_list", {"run_id": "run-mcp"}, "steps.list")
        assert [s["id"] for s in listed["data"]] == [step_id] and listed["meta"]["total"] == 1
        # The search box's string: the recipient's address, in any case, finds the same step.
        found = await call(c, "evq_steps_list", {"search": sent["to"][0].upper()}, "steps.list")
        assert [s["id"] for s in found["data"]] == [step_id] and found["meta"]["total_exact"] is True
        none = await call(c, "evq_steps_list", {"search": "nobody@example.com"}, "steps.list")
        assert none["data"] == [] and none["meta"]["total"] == 0
        planned = await call(c, "evq_steps_enqueue", {**request(run_id="run-mcp"), "dry_run": True}, "steps.enqueue")
        assert planned["data"]["plan"][0]["action"] == "create"
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 1


@pytest.mark.parametrize(
    ("tool", "arguments", "code", "field"),
    [
        ("evq_steps_enqueue", {**request(), "subject": "two\nlines"}, "E_INVALID_ARG", "subject"),
        ("evq_steps_enqueue", {**request(), "api_key": "evq_x"}, "E_INVALID_ARG", "api_key"),
        ("evq_steps_enqueue", {**request(), "dry_run": "yes"}, "E_INVALID_ARG", "dry_run"),
        ("evq_steps_show", {"step_id": "seven"}, "E_INVALID_ARG", "step_id"),
        ("evq_steps_show", {}, "E_INVALID_ARG", "step_id"),
        ("evq_steps_list", {"status": ["lost"], "limit": 5000}, "E_INVALID_ARG", "status"),
        ("evq_steps_list", {"older_than": "soon"}, "E_INVALID_ARG", "older_than"),
        ("evq_steps_show", {"step_id": 4242}, "E_NOT_FOUND", None),
        ("evq_runs_show", {"run_id": "nope"}, "E_NOT_FOUND", None),
    ],
)
async def test_a_refused_call_is_an_error_result_with_the_contract_code(db_url, tool, arguments, code, field):
    admin = await key(db_url, "root", "admin", created_by=None)
    command = {
        "evq_steps_enqueue": "steps.enqueue",
        "evq_steps_show": "steps.show",
        "evq_steps_list": "steps.list",
        "evq_runs_show": "runs.show",
    }[tool]
    async with client(db_url, admin) as c:
        body = await call(c, tool, arguments, command)
    assert body["status"] == "error" and body["error"]["code"] == code
    if field:
        assert body["error"]["context"]["fields"][0]["field"] == field
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0


async def test_the_key_comes_from_the_server_and_its_role_counts(db_url):
    operator = await key(db_url, "alice", "operator", created_by=None)
    async with client(db_url, None) as c:
        missing = await call(c, "evq_steps_list", {}, "steps.list")
        assert missing["error"]["code"] == "E_AUTH_FAILED" and "EVQ_API_KEY" in missing["error"]["hint"]
    async with client(db_url, operator) as c:
        assert (await call(c, "evq_steps_list", {}, "steps.list"))["status"] == "success"
        refused = await call(c, "evq_steps_enqueue", request(), "steps.enqueue")
        assert refused["error"]["code"] == "E_AUTH_FAILED"
    async with client(db_url, operator + "x") as c:
        assert (await call(c, "evq_steps_list", {}, "steps.list"))["error"]["code"] == "E_AUTH_FAILED"


async def test_resolving_is_offered_only_when_configured_and_dry_runs_by_default(db_url, store):
    [step] = await unknown_steps(store)
    operator = await key(db_url, "alice", "operator", created_by=None)
    async with client(db_url, operator) as c:
        assert "evq_steps_resolve" not in {t.name for t in (await c.list_tools()).tools}
    async with client(db_url, operator, mcp_resolve=True) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["evq_steps_resolve"].input_schema["properties"]["dry_run"]["default"] is True
        close = {"step_id": step.id, "as": "accepted", "note": "in the provider log"}
        preview = await call(c, "evq_steps_resolve", close, "steps.resolve")
        assert preview["data"]["dry_run"] is True and step_row(db_url, step.id)["status"] == "unknown"
        done = await call(c, "evq_steps_resolve", {**close, "dry_run": False}, "steps.resolve")
        assert done["data"]["results"][0]["to_status"] == "accepted"
        conflict = await call(c, "evq_steps_resolve", {**close, "dry_run": False}, "steps.resolve")
        assert conflict["error"]["code"] == "E_CONFLICT"
    assert rows(db_url, "SELECT actor FROM evidence WHERE kind = 'operator_resolved'") == [{"actor": "alice"}]


async def test_an_agent_over_mcp_never_approves_its_held_send_and_may_cancel_it(db_url):
    agent = await key(db_url, "bot", "agent", created_by=None)
    operator = await key(db_url, "alice", "operator", created_by=None)
    async with client(db_url, agent) as c:
        assert "evq_steps_approve" not in {t.name for t in (await c.list_tools()).tools}  # not offered by default
    async with client(db_url, agent, mcp_approve=True) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
        assert tools["evq_steps_approve"].input_schema["properties"]["dry_run"]["default"] is True
        asked = request(run_id="run-held", step_id="a", html="<p>as asked</p>")
        held = await call(c, "evq_steps_enqueue", asked, "steps.enqueue")
        other = await call(c, "evq_steps_enqueue", request(run_id="run-held", step_id="b"), "steps.enqueue")
    for made in (held, other):
        execute(
            db_url,
            "UPDATE email_steps SET status = 'held', reason = 'approval_required', held_since = now() WHERE id = %s",
            (made["data"]["id"],),
        )
        execute(db_url, "DELETE FROM step_queue WHERE id = %s", (made["data"]["id"],))
    ask = {"step_id": held["data"]["id"], "note": "mine", "dry_run": False}
    async with client(db_url, agent, mcp_approve=True) as c:
        refused = await call(c, "evq_steps_approve", ask, "steps.approve")
        assert refused["error"]["code"] == "E_AUTH_FAILED"  # an agent key never approves (exit 4)
        assert (await call(c, "evq_steps_deny", ask, "steps.deny"))["error"]["code"] == "E_AUTH_FAILED"
        preview = await call(c, "evq_steps_cancel", {"step_id": other["data"]["id"]}, "steps.cancel")
        assert preview["data"]["dry_run"] is True and step_row(db_url, other["data"]["id"])["status"] == "held"
        cancel = {"step_id": other["data"]["id"], "dry_run": False}
        assert (await call(c, "evq_steps_cancel", cancel, "steps.cancel"))["data"]["reason"] == "cancelled"
    assert step_row(db_url, held["data"]["id"])["status"] == "held"
    async with client(db_url, operator, mcp_approve=True) as c:
        # A corrected text must say what becomes of the HTML part (issue 29): refused, then dropped.
        fix = {**ask, "note": "checked", "text": "corrected"}
        refused = await call(c, "evq_steps_approve", fix, "steps.approve")
        assert refused["error"]["code"] == "E_INVALID_ARG"
        assert refused["error"]["context"]["fields"][0]["field"] == "html"
        done = await call(c, "evq_steps_approve", {**fix, "drop_html": True}, "steps.approve")
    assert done["data"]["to_status"] == "pending" and step_row(db_url, held["data"]["id"])["status"] == "pending"
    assert step_row(db_url, held["data"]["id"])["payload"]["html"] is None


async def test_evq_mcp_over_stdio(db_url):
    """The real command, as an MCP client starts it: stdout carries only the protocol."""
    agent = await key(db_url, "bot", "agent", created_by=None)
    env = {**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_API_KEY": agent, "EVQ_LOG_FORMAT": "json"}
    params = StdioServerParameters(command=sys.executable, args=["-m", "tests.child", "mcp"], env=env)
    async with Client(params) as c:
        listed = {t.name: t for t in (await c.list_tools()).tools}
        # The hints travel over the real protocol (camelCase on the wire, the SDK's fields here).
        send = listed["evq_steps_enqueue"].annotations
        assert (send.destructive_hint, send.idempotent_hint, send.open_world_hint) == (True, True, True)
        sent = await call(c, "evq_steps_enqueue", request(run_id="run-stdio"), "steps.enqueue")
        shown = await call(c, "evq_steps_show", {"step_id": sent["data"]["id"]}, "steps.show")
    assert shown["data"]["step"]["run_id"] == "run-stdio"


async def test_the_mcp_server_says_which_evq_it_is_over_stdio(db_url):
    """serverInfo names evq and its version (the one `evq --version` prints), over the real
    protocol from a real `evq mcp` child, so an agent platform can tell what it talks to."""
    from evq import __version__

    env = {**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_LOG_FORMAT": "json"}
    env.pop("EVQ_API_KEY", None)
    params = StdioServerParameters(command=sys.executable, args=["-m", "tests.child", "mcp"], env=env)
    async with Client(params) as c:
        info = c.server_info
        assert (info.name, info.version) == ("evq", __version__) and __version__
        assert "evq_admin_health" in {t.name for t in (await c.list_tools()).tools}


async def test_a_revoked_key_stops_working_at_the_next_call(db_url, store):
    """The server remembers a verified key, yet reads its row on every call: a revoke applies at once."""
    agent = await key(db_url, "bot", "agent", created_by=None)
    async with client(db_url, agent) as c:
        assert (await call(c, "evq_steps_list", {}, "steps.list"))["status"] == "success"
        await store.revoke_key("bot", actor="root")
        refused = await call(c, "evq_steps_enqueue", request(), "steps.enqueue")
        assert refused["error"]["code"] == "E_AUTH_FAILED" and "revoked" in refused["error"]["message"]
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0


async def test_a_refused_send_is_recorded_with_the_servers_key_and_required_provenance(db_url):
    agent = await key(db_url, "bot", "agent", created_by=None)
    sent = request(run_id="run-mcp-refused", decision={"model": "m-1"})
    async with client(db_url, agent, require_provenance=("model", "instruction_version")) as c:
        refused = await call(c, "evq_steps_enqueue", sent, "steps.enqueue")
    assert refused["error"]["code"] == "E_INVALID_ARG"
    assert [f["field"] for f in refused["error"]["context"]["fields"]] == ["decision.instruction_version"]
    [row] = await asyncio.to_thread(rows, db_url, "SELECT * FROM enqueue_refusals")
    assert (row["interface"], row["key_name"], row["reasons"]) == ("mcp", "bot", ["decision"])
    assert row["asked"][0]["run_id"] == "run-mcp-refused" and sent["text"] not in str(row)
    [count] = await asyncio.to_thread(rows, db_url, "SELECT * FROM enqueue_refusal_counts")
    assert count == {"interface": "mcp", "field": "decision", "total": 1}


async def test_an_agent_over_mcp_is_answered_as_its_pruned_step_ended(db_url, store):
    sent = request(run_id="run-mcp", step_id="pruned")
    a_month_ago = datetime.now(UTC) - timedelta(days=30)
    first = await accepted_step(store, sent, now=a_month_ago)
    assert prune_closed(db_url) == 1
    agent = await key(db_url, "bot", "agent", created_by=None)
    async with client(db_url, agent) as c:
        again = (await call(c, "evq_steps_enqueue", sent, "steps.enqueue"))["data"]
        gone = (await call(c, "evq_steps_show", {"step_id": first.id}, "steps.show"))["error"]
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
    assert (again["id"], again["message_id"], again["created"]) == (first.id, first.message_id, False)
    assert (again["status"], again["pruned"], again["next_action"]) == ("accepted", True, "none")
    assert (gone["code"], gone["context"]["pruned"]) == ("E_NOT_FOUND", True)
