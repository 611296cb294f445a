"""`evq schema --all` checked against itself and against the real click tree: the invariants
agent CLIs state for progressive disclosure (dws schema's "Validation Invariants"), so a
script that reads only the catalogue is told the truth about every command."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from evq.ops.app.commands import COMMANDS
from evq.ops.cli import cli
from evq.ops.cli.table import find
from tests.contract import leaf_commands


def schema(*args: str) -> dict:
    done = CliRunner().invoke(cli, ["schema", *args, "-o", "json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads(done.output)["data"]


@pytest.fixture(scope="module")
def catalogue() -> dict:
    return schema("--all")


def tools(catalogue: dict) -> list[dict]:
    return [t for g in catalogue["groups"] for t in g["tools"]]


def test_canonical_paths_are_unique_and_every_tool_has_one_and_a_cli_path(catalogue):
    paths = [t["canonical_path"] for t in tools(catalogue)]
    assert len(paths) == len(set(paths)) == len(COMMANDS)
    for t in tools(catalogue):
        assert t["canonical_path"] and t["cli_path"] and t["primary_cli_path"] == t["cli_path"]
        assert t["is_alias"] is False and t["canonical_path"] == f"{t['group']}.{t['name']}"


def test_the_overview_counts_the_primary_tools_and_embeds_none(catalogue):
    root = schema()
    assert root["level"] == "groups" and schema("list") == root
    assert all(set(g) == {"name", "summary", "tool_count"} for g in root["groups"])
    assert sum(g["tool_count"] for g in root["groups"]) == root["tool_count"] == len(tools(catalogue))
    assert [(g["name"], g["tool_count"]) for g in root["groups"]] == [
        (g["name"], len(g["tools"])) for g in catalogue["groups"]
    ]
    for g in root["groups"]:
        group = schema(g["name"])
        assert group["tool_count"] == g["tool_count"] == len(group["tools"])


def test_every_leaf_has_its_parameters_counted(catalogue):
    for t in tools(catalogue):
        assert isinstance(t["parameters"], dict), t["canonical_path"]
        assert t["parameter_count"] == len(t["parameters"]), t["canonical_path"]
        assert t["has_parameters"] is (t["parameter_count"] > 0), t["canonical_path"]
        one = schema(t["canonical_path"])
        assert {k: v for k, v in one.items() if k != "level"} == t


def test_parameters_are_the_real_command_definitions(catalogue):
    """Each tool's parameters, in order, are the click command's at its cli_path: names, flags,
    kinds, requiredness, repetition, choices, bounds."""
    for t in tools(catalogue):
        cmd = find(cli, t["cli_path"])
        real = [p for p in cmd.params if p.name != "help"]
        keys = [p.human_readable_name if isinstance(p, click.Argument) else p.opts[-1][2:] for p in real]
        assert keys == list(t["parameters"]), t["canonical_path"]
        for clicked, (key, p) in zip(real, t["parameters"].items(), strict=True):
            where = (t["canonical_path"], key)
            assert p["required"] is clicked.required, where
            assert p["multiple"] is (clicked.multiple or clicked.nargs == -1), where
            if isinstance(clicked, click.Argument):
                assert p["kind"] == "argument" and p["flags"] == [], where
                continue
            assert [*clicked.opts, *clicked.secondary_opts] == p["flags"], where
            assert p["kind"] == ("flag" if clicked.is_flag else "option"), where
            assert list(getattr(clicked.type, "choices", ())) == p.get("enum", []), where
            bounds = (getattr(clicked.type, "min", None), getattr(clicked.type, "max", None))
            assert bounds == (p.get("minimum"), p.get("maximum")), where
            if not p.get("enum") and not clicked.is_flag:
                assert _json_type(clicked.type) == p["type"], where
            assert p["description"] == (clicked.help or ""), where
        for key, p in t["parameters"].items():
            for other in p.get("required_when", {}).get("unless_any", []):
                assert other in t["parameters"], (t["canonical_path"], key, other)


def test_no_hidden_command_is_listed_and_every_alias_is_the_same_tool(catalogue):
    listed = {t["cli_path"] for t in tools(catalogue)}
    visible = {path for path, _ in leaf_commands(cli)}
    assert {t["canonical_path"] for t in tools(catalogue)} == visible
    aliases = {a: t for t in tools(catalogue) for a in t["aliases"]}
    every = [path for path, _ in leaf_commands(cli, hidden=True)]
    # The hidden leaves are exactly the aliases, each under the tool it runs.
    assert len(every) == len(listed) + len(aliases)
    for alias, t in aliases.items():
        assert alias not in listed
        words = alias.split()
        assert cli.commands[words[0]].hidden or find(cli, alias).hidden, alias
        through = schema(*words)
        assert through["is_alias"] is True and through["cli_path"] == alias
        assert through["canonical_path"] == t["canonical_path"] and through["primary_cli_path"] == t["cli_path"]
        assert schema(alias.replace(" ", "."))["canonical_path"] == t["canonical_path"]


def test_every_tool_says_when_and_how_carefully(catalogue):
    for t in tools(catalogue):
        assert t["use_when"] and t["avoid_when"], t["canonical_path"]
        assert t["effect"] in ("read", "write", "send") and t["risk"] in ("low", "medium", "high")
        if t["needs_confirmation"]:
            assert "dry-run" in t["parameters"], t["canonical_path"]
        if t["effect"] == "read":
            assert t["risk"] == "low", t["canonical_path"]
        interfaces = t["interfaces"]
        assert interfaces["cli"] == f"evq {t['cli_path']}"
        # A command without an HTTP route or an MCP tool says why.
        assert bool(interfaces["http"] and interfaces["mcp"]) or interfaces["local_only"], t["canonical_path"]
        if interfaces["mcp"]:
            assert interfaces["mcp"] == "evq_" + t["canonical_path"].replace(".", "_").replace("-", "_")
        if interfaces["http"]:
            assert interfaces["http"][0]["operation_id"] == t["canonical_path"]


def _json_type(kind: click.ParamType) -> str:
    if isinstance(kind, click.types.IntParamType):
        return "integer"
    if isinstance(kind, click.types.FloatParamType):
        return "number"
    assert isinstance(kind, click.types.StringParamType), kind
    return "string"
