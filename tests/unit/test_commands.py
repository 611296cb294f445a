"""The command table (ops/app/commands.py) is the one description of every command: the
click commands, the HTTP API's inputs and the MCP tools' inputs are all the table's."""

from __future__ import annotations

import json

import click
import pytest

from evq.ops.app.commands import BENCH_MODES, COMMANDS, CREDENTIAL, GROUPS, Kind, command
from evq.ops.app.schemas import command_input
from evq.ops.cli import cli
from tests.contract import leaf_commands

LEAVES = dict(leaf_commands(cli))


def test_every_table_command_is_a_cli_command_and_back():
    assert set(LEAVES) == set(COMMANDS)
    groups = {name: cmd for name, cmd in cli.commands.items() if isinstance(cmd, click.Group)}
    assert {name: cmd.help for name, cmd in groups.items()} == GROUPS


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

    settings = Settings.load(database_url="postgresql://nobody@127.0.0.1:1/x", mcp_resolve=True)
    tools = {t.name: t for t in build_server(None, settings, None)._tool_manager.list_tools()}
    assert tools["evq_steps_list"].parameters == command_input("steps.list")
    assert tools["evq_runs_get"].parameters == command_input("runs.show")
    assert tools["evq_steps_get"].parameters == command_input("steps.show", rename={"step_id": "id"})
    resolve = tools["evq_steps_resolve"].parameters
    assert resolve == command_input("steps.resolve", rename={"step_id": "id"}, defaults={"dry_run": True})
    table = command("steps.resolve")
    remote = [p for p in table.params if not p.local]
    assert list(resolve["properties"]) == ["id" if p.dest == "step_id" else p.property for p in remote]
    assert resolve["properties"]["older_than"]["description"] == table.param("older_than").help

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
    assert body == json.loads(json.dumps(command_input("steps.resolve", exclude=("step_id",))), parse_int=float)


def test_the_bench_modes_are_the_benchmarks():
    from evq.ops.bench.modes import MODES

    assert tuple(MODES) == BENCH_MODES
