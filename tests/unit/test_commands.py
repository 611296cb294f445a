"""The command table (ops/app/commands/) is the one description of every command: the
click commands, the HTTP API's inputs and the MCP tools' inputs are all the table's."""

from __future__ import annotations

import json

import click
import pytest

from evq.ops.app.commands import BENCH_MODES, COMMANDS, CREDENTIAL, GROUPS, Kind, command, lookup, mcp_name
from evq.ops.app.schemas import command_input
from evq.ops.cli import cli
from evq.ops.cli.table import find
from tests.contract import leaf_commands

LEAVES = dict(leaf_commands(cli))


def test_every_table_command_is_a_cli_command_and_back():
    assert set(LEAVES) == set(COMMANDS)
    groups = {name: cmd for name, cmd in cli.commands.items() if isinstance(cmd, click.Group) and not cmd.hidden}
    # `schema` is the one group that is a command of its own (`evq schema steps` takes a name).
    assert {name: cmd.help for name, cmd in groups.items()} == {g: h for g, h in GROUPS.items() if g != "schema"}
    assert {c.group for c in COMMANDS.values()} == set(GROUPS)
    for path, entry in COMMANDS.items():
        assert find(cli, entry.words) is LEAVES[path]
        assert lookup(path) == lookup(entry.words) == (entry, False)


def test_every_alias_is_the_same_command_hidden():
    """`evq enqueue` runs `evq steps enqueue`: the same body and the very same parameters."""
    aliases = {alias: entry for entry in COMMANDS.values() for alias in entry.aliases}
    assert {"enqueue", "prune", "db status", "db upgrade", "serve", "mcp", "demo", "bench"} <= set(aliases)
    visible = {id(cmd) for cmd in LEAVES.values()}
    every = list(leaf_commands(cli, hidden=True))
    assert len(every) == len(COMMANDS) + len(aliases)
    for alias, entry in aliases.items():
        clicked, primary = find(cli, alias), LEAVES[entry.path]
        assert id(clicked) not in visible and (clicked.hidden or find(cli, alias.split()[0]).hidden)
        assert clicked.callback is primary.callback and clicked.params is primary.params
        assert lookup(alias) == lookup(alias.replace(" ", ".")) == (entry, True)
        assert f"evq {entry.words}" in clicked.help


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_click_parameter_comes_from_the_table(path):
    """A click.option added by hand, or one described differently, shows here."""
    entry, cmd = COMMANDS[path], LEAVES[path]
    params = [p for p in cmd.params if p.name != "help"]
    assert [p.name for p in params] == [p.dest for p in entry.params]
    assert cmd.short_help == entry.summary and cmd.help.startswith(entry.help)
    for clicked, p in zip(params, entry.params, strict=True):
        assert clicked.required == p.required, p.dest
        if p.kind is Kind.ARGUMENT:
            assert isinstance(clicked, click.Argument) and clicked.nargs == (-1 if p.repeatable else 1)
            continue
        assert isinstance(clicked, click.Option)
        assert [*clicked.opts, *clicked.secondary_opts] == list(p.flags)
        assert clicked.is_flag == (p.kind is Kind.FLAG) and clicked.multiple == p.repeatable
        assert clicked.help == (p.help or None), p.dest
        choices = list(getattr(clicked.type, "choices", ()))
        assert choices == list(p.enum), p.dest
        bounds = (getattr(clicked.type, "min", None), getattr(clicked.type, "max", None))
        assert bounds == (p.minimum, p.maximum), p.dest
        # click reads the API key's variable (and steps show's key for content); a setting's
        # variable is the settings loader's.
        assert clicked.envvar == (p.env if p.dest == CREDENTIAL or not p.setting else None), p.dest


def test_the_http_and_mcp_inputs_are_the_tables():
    from evq.ops.mcp.server import build_server
    from evq.ops.settings import Settings
    from evq.ops.wiring import serve_app

    settings = Settings.load(database_url="postgresql://nobody@127.0.0.1:1/x", mcp_resolve=True, mcp_approve=True)
    tools = {t.name: t for t in build_server(None, settings, None, health=None)._tool_manager.list_tools()}
    # One tool per command the table marks, named after it.
    assert set(tools) == {mcp_name(path) for path, c in COMMANDS.items() if c.mcp}
    for path in ("steps.list", "runs.show", "steps.show", "providers.list"):
        assert tools[mcp_name(path)].parameters == command_input(path), path
    resolve = tools["evq_steps_resolve"].parameters
    # The one difference: a tool dry-runs unless told not to.
    assert resolve == command_input("steps.resolve", defaults={"dry_run": True})
    table = command("steps.resolve")
    remote = [p for p in table.params if not p.local]
    assert list(resolve["properties"]) == [p.property for p in remote]
    assert resolve["properties"]["older_than"]["description"] == table.param("older_than").help
    # The send request's top-level fields are `steps enqueue`'s properties (decision.* inside one).
    enqueue = command("steps.enqueue")
    sent = {p.property.split(".")[0] for p in enqueue.params if not p.local}
    assert set(tools["evq_steps_enqueue"].parameters["properties"]) == sent

    app = serve_app(settings, url=settings.database_url)
    while not hasattr(app, "openapi"):  # the guards around FastAPI
        app = app.app
    doc = app.openapi()
    steps_list = command("steps.list")
    query = {q["name"]: q for q in doc["paths"]["/v1/steps"]["get"]["parameters"]}
    for p in steps_list.params:
        if p.local:
            continue
        q = query[p.property]
        assert q.get("description") == p.help, p.dest
        if p.type == "integer":
            assert q["schema"].get("minimum") == p.minimum, p.dest
    body = doc["paths"]["/v1/steps/resolve"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    # The OpenAPI document writes its numbers as floats.
    assert body == json.loads(json.dumps(command_input("steps.resolve")), parse_int=float)

    # Every route the table names, under the command's canonical name; no other /v1 operation.
    operations = {(method.upper(), path): op for path, item in doc["paths"].items() for method, op in item.items()}
    routed = set()
    for path, entry in COMMANDS.items():
        for route in entry.http:
            op = operations[(route.method, route.path)]
            assert op["operationId"] == entry.operation_id(route) and op["x-evq-command"] == path
            routed.add((route.method, route.path))
        if entry.http:
            assert entry.operation_id(entry.http[0]) == path
    # The providers' webhook route is no command: a provider calls it, signed, never an agent or operator.
    assert {key for key in operations if key[1].startswith("/v1") and not key[1].startswith("/v1/webhooks/")} == routed


def test_the_bench_modes_are_the_benchmarks():
    from bench.modes import MODES

    assert tuple(MODES) == BENCH_MODES


@pytest.mark.parametrize("path", sorted(p for p, c in COMMANDS.items() if any(x.required for x in c.params)))
def test_a_required_parameter_left_out_is_refused_by_the_parser(path):
    """Not by the command body, where a None fails as E_INTERNAL (click 8.4 treats an explicit
    ``default=None`` as given: `evq keys create` without --name reached check_name(None))."""
    entry, cmd = COMMANDS[path], LEAVES[path]
    required = [p for p in entry.params if p.required]

    def given(p):
        sample = p.example if p.example is not None else (p.enum or ("x",))[0]
        return [str(sample)] if p.kind is Kind.ARGUMENT else [p.flags[-1], str(sample)]

    for left_out in required:
        args = [a for p in required if p is not left_out for a in given(p)]
        with pytest.raises(click.MissingParameter) as refused:
            cmd.make_context(path, args)
        assert refused.value.param is not None and refused.value.param.name == left_out.dest
