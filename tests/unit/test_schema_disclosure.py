"""`evq schema`, every level, checked against the schema contract agent CLIs share for progressive
disclosure (docs/design.md, "The command table"), against the real click tree and the MCP server's
tools, and against the committed snapshot of the surface: a script or an agent that reads only
the catalogue is told the truth about every command, and can tell when it changed."""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from evq.ops.app import commands as table
from evq.ops.app.commands import COMMANDS, GROUPS
from evq.ops.cli import cli
from evq.ops.cli.schema import REGENERATE, SNAPSHOT, surface, surface_hash
from evq.ops.cli.table import find
from tests import contract
from tests.contract import leaf_commands

ROOT = Path(__file__).resolve().parents[2]


def answer(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = CliRunner().invoke(cli, ["schema", *args, "-o", "json"], catch_exceptions=False, env=env)
    assert done.exit_code == 0, done.output
    body = json.loads(done.output)
    contract.check(("schema", *args), body)  # every level validates against schema-show.schema.json
    return body


def schema(*args: str) -> dict[str, Any]:
    return answer(*args)["data"]


@pytest.fixture(scope="module")
def catalogue() -> dict[str, Any]:
    return schema("--all")


def tools(catalogue: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in catalogue["products"] for t in p["tools"]]


def mcp_input_properties() -> dict[str, set[str]]:
    """Each MCP tool's argument names, as `evq admin mcp` lists them (every tool offered)."""
    from mcp import Client

    from evq.ops.mcp.server import build_server
    from evq.ops.settings import Settings

    settings = Settings.load(
        env={}, database_url="postgresql://evq@127.0.0.1:1/none", mcp_resolve=True, mcp_approve=True
    )

    async def listed() -> dict[str, set[str]]:
        # Listing tools touches no store: the server describes them from the table.
        async with Client(build_server(None, settings, None, health=None)) as c:
            return {t.name: set(t.input_schema["properties"]) for t in (await c.list_tools()).tools}

    return asyncio.run(listed())


def test_every_level_keeps_every_invariant_of_the_schema_contract(catalogue):
    overview, everything = schema(), tools(catalogue)
    products = {p["name"]: schema(p["name"]) for p in overview["products"]}
    leaves = {t["canonical_path"]: schema(t["canonical_path"]) for t in everything}

    # -- progressive queries ----------------------------------------------------------------
    # The bare query is the compact overview: products with their tool counts, no tool arrays.
    assert overview["level"] == "products" and [p["name"] for p in overview["products"]] == sorted(GROUPS)
    assert all("tools" not in p and p["tool_count"] >= 1 for p in overview["products"])
    # `list` is only another name for that overview.
    assert schema("list") == overview
    # A product's query lists that product's tools, as summaries, and no other product's.
    for name, product in products.items():
        assert product["level"] == "product" and product["product_id"] == name
        assert {t["product_id"] for t in product["tools"]} == {name}
        assert [t["canonical_path"] for t in product["tools"]] == sorted(
            p for p in COMMANDS if p.startswith(name + ".")
        )
        assert all("parameters" not in t for t in product["tools"])  # summaries; the leaf has the rest
    # A group query lists only the tools beneath that group: evq's products have no sub-groups (every
    # canonical path is product.action), so no query can mean one, and none answers as one.
    assert all(path.count(".") == 1 and path.split(".")[0] in products for path in COMMANDS)
    # A tool's query answers one flat leaf: its identity and parameters at the top, no envelope.
    for path, leaf in leaves.items():
        assert leaf["level"] == "tool" and leaf["canonical_path"] == path
        assert isinstance(leaf["parameters"], dict) and "inputSchema" not in leaf and "input_schema" not in leaf
    # --all is the whole catalogue: every product with every tool, each the complete leaf.
    assert catalogue["level"] == "all" and [p["name"] for p in catalogue["products"]] == sorted(GROUPS)
    for t in everything:
        assert {**t, "level": "tool"} == leaves[t["canonical_path"]]

    # -- source of truth --------------------------------------------------------------------
    # A local helper stays visible and queryable, its source hardcoded:<product>; a tool the MCP
    # server serves says so (mcp:<product>). No tool has any other source.
    for t in everything:
        kind = "mcp" if t["interfaces"]["mcp"] else "hardcoded"
        assert t["source"] == f"{kind}:{t['product_id']}", t["canonical_path"]
        if kind == "hardcoded":
            assert t["interfaces"]["local_only"], t["canonical_path"]
    # (Described from the table, never by asking a server; no endpoint, credential or time in it:
    # test_the_schema_is_built_from_evq_alone_whatever_the_environment_holds.)

    # -- agent metadata ---------------------------------------------------------------------
    # The overview routes: each product says when to use it and when not.
    for p in overview["products"]:
        assert p["use_when"] and p["avoid_when"] and p["use_when"] != p["avoid_when"], p["name"]
        assert {k: p[k] for k in ("use_when", "avoid_when")} == {
            k: products[p["name"]][k] for k in ("use_when", "avoid_when")
        }
    # The overview summarises what the interfaces serve: the figures are the catalogue's own.
    served = overview["interface_metadata"]
    assert served == catalogue["interface_metadata"]
    assert served["tools"] == len(everything) == overview["tool_count"]
    assert served["cli_aliases"] == sum(len(t["aliases"]) for t in everything)
    assert served["http_operations"] == sum(len(t["interfaces"]["http"]) for t in everything)
    assert served["mcp_tools"] == sum(1 for t in everything if t["interfaces"]["mcp"])
    assert served["local_only"] == sum(1 for t in everything if t["interfaces"]["local_only"])
    # ... and carries the agent metadata's version and a digest of the whole described surface:
    # SHA-256 of the catalogue as canonical JSON, the metadata about it aside.
    meta = overview["agent_metadata"]
    assert meta == catalogue["agent_metadata"] and meta["version"] >= 1
    assert (meta["products"], meta["tools"]) == (len(overview["products"]), len(everything))
    described = {k: v for k, v in catalogue.items() if k not in ("level", "agent_metadata")}
    canonical = json.dumps(described, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    assert meta["surface_hash"] == f"sha256:{digest}"
    # Each tool summary says when to use it, when not, its effect, its risk and whether to confirm.
    for product in products.values():
        for t in product["tools"]:
            assert t["use_when"] and t["avoid_when"], t["canonical_path"]
            assert t["effect"] in ("read", "write", "send") and t["risk"] in ("low", "medium", "high")
            assert isinstance(t["needs_confirmation"], bool)
            # The summary is the leaf's, cut short: the same values.
            assert t == {k: leaves[t["canonical_path"]][k] for k in t}
    # A tool's detail adds its examples, where its effect was declared and where its metadata comes
    # from: each reference is a file of this repository that names the tool, or its help.
    for path, leaf in leaves.items():
        assert isinstance(leaf["examples"], list) and leaf["effect_source"] == "command_table"
        files, others = [], []
        for ref in leaf["agent_source_refs"]:
            (others if ref.startswith("cli:") else files).append(ref)
        assert others == [f"cli:evq {leaf['primary_cli_path']} --help"], path
        source, _, anchor = files[0].partition("#")
        assert source.startswith("ops/app/commands/") and anchor == path, (path, files[0])
        assert f'"{path}"' in (ROOT / source).read_text(), (path, source)
        for ref in files:
            assert (ROOT / ref.split("#")[0]).is_file(), (path, ref)
        assert json.loads((ROOT / files[1]).read_text())["title"] == leaf["output_schema"]["title"], path

    # -- path rules -------------------------------------------------------------------------
    listed = {t["cli_path"] for t in everything}
    for path, leaf in leaves.items():
        # canonical_path is the stable product.name, and path is the same name.
        assert leaf["canonical_path"] == leaf["path"] == f"{leaf['product_id']}.{leaf['name']}"
        # cli_path is a command line that runs, and lists show only its primary one.
        assert leaf["cli_path"] == leaf["primary_cli_path"] and leaf["is_alias"] is False
        assert not find(cli, leaf["cli_path"]).hidden
        # Every spelling of the tool answers the same leaf: canonical, dotted and spaced command
        # line, the words apart, and --cli-path. A command line that is also a product's name
        # (`schema`) names the product when given as NAME, never silently the tool: --cli-path is
        # the explicit spelling that names the tool.
        words = leaf["cli_path"]
        for spelling in ((words,), (words.replace(" ", "."),), tuple(words.split())):
            expected = products[words] if words in products else leaf
            assert schema(*spelling) == expected, (path, spelling)
        assert schema("--cli-path", words) == leaf
        # Other command lines for it are its aliases, never listed as tools of their own; asked for,
        # each answers the same canonical_path with is_alias true.
        for alias in leaf["aliases"]:
            assert alias not in listed
            for through in (
                schema(alias),
                schema("--cli-path", alias),
                schema(alias.replace(" ", ".")),
                schema(*alias.split()),
            ):
                assert through["is_alias"] is True and through["cli_path"] == alias, (path, alias)
                assert {**through, "is_alias": False, "cli_path": words} == leaf

    # -- the leaf's parameters --------------------------------------------------------------
    mcp = mcp_input_properties()
    for path, leaf in leaves.items():
        params = leaf["parameters"]
        for key, p in params.items():
            where = (path, key)
            # Keyed by the real flag name without --, an argument by its metavar.
            if p["kind"] == "argument":
                assert key == key.upper() and p["flags"] == [], where
            else:
                assert f"--{key}" in p["flags"] and not key.startswith("-"), where
            # required is inline and unconditional; a condition is required_when, never both.
            assert isinstance(p["required"], bool), where
            if "required_when" in p:
                assert p["required"] is False and p["required_when"]["description"], where
                assert set(p["required_when"]["unless_any"]) <= set(params) - {key}, where
            # A default is shown only when it says something.
            assert p.get("default", "given") not in (None, "", False, []), where
        # property is the name the MCP tool takes: exactly the served tool's arguments (a dotted
        # property is a field inside one, decision.model); null only for the command line's own.
        if leaf["interfaces"]["mcp"]:
            properties = {p["property"].split(".")[0] for p in params.values() if p["property"] is not None}
            assert properties == mcp[leaf["interfaces"]["mcp"]], path
        assert all(p["property"] is None for p in params.values() if p.get("env") == "EVQ_API_KEY"), path
        # A tool without parameters would say parameters {}, has_parameters false, count 0.
        assert leaf["has_parameters"] is bool(params) and leaf["parameter_count"] == len(params), path

    # -- validation invariants --------------------------------------------------------------
    # canonical_path is unique across the catalogue's products[].tools[].
    paths = [t["canonical_path"] for t in everything]
    assert len(paths) == len(set(paths)) == len(COMMANDS)
    # The overview's tool_count is the catalogue's primary tools, and so is each product's.
    assert overview["tool_count"] == len(everything) == catalogue["tool_count"]
    assert [(p["name"], p["tool_count"]) for p in overview["products"]] == [
        (p["name"], len(p["tools"])) for p in catalogue["products"]
    ]
    assert all(p["tool_count"] == len(products[p["name"]]["tools"]) for p in overview["products"])
    # Every listed tool has canonical_path and cli_path, in the product lists and in the catalogue.
    for t in [*everything, *(t for p in products.values() for t in p["tools"])]:
        assert t["canonical_path"] and t["cli_path"], t
    # Every leaf has parameters, has_parameters and parameter_count, the count the keys'.
    for leaf in [*leaves.values(), *everything]:
        assert leaf["parameter_count"] == len(leaf["parameters"]) and leaf["has_parameters"] is bool(leaf["parameters"])
    # Hidden commands (the aliases' old spellings) are not tools; every visible leaf is one.
    assert set(paths) == {path for path, _ in leaf_commands(cli)}


def test_the_schema_is_built_from_evq_alone_whatever_the_environment_holds():
    """Described from the command table, never by asking a server (no MCP tools/list, no database)
    and never with an endpoint, a credential or a time in it: a child run with secrets and a
    database that does not answer prints the catalogue byte for byte as one with none, and loads
    neither the MCP SDK nor a database driver."""
    probe = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from evq.ops.cli import cli\n"
        "out = CliRunner().invoke(cli, ['schema', '--all', '-o', 'json']).output\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'psycopg', 'httpx', 'fastapi')"
        " or m.startswith('evq.ops.mcp') or m.startswith('evq.ops.web'))\n"
        "print(json.dumps({'data': json.loads(out)['data'], 'loaded': loaded}))\n"
    )
    secrets = {
        "EVQ_DATABASE_URL": "postgresql://evq:db-secret-7@db.internal.example:1/evq",
        "EVQ_API_KEY": "evq_0123456789ab_api-secret-7",
        "EVQ_SMTP_HOST": "smtp.internal.example",
        "EVQ_SMTP_PASSWORD": "smtp-secret-7",
        "EVQ_HTTP_API_KEY": "provider-secret-7",
        "EVQ_ADAPTER": "http",
    }
    bare = {k: v for k, v in os.environ.items() if not k.startswith("EVQ_")}
    runs = []
    for env in (bare, {**bare, **secrets}):
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout)
    assert runs[0] == runs[1]
    got = json.loads(runs[1])
    assert got["loaded"] == []
    for value in secrets.values():
        if "secret" in value or "internal" in value:
            assert value not in runs[1] and value.split("@")[-1] not in runs[1], value
    assert got["data"]["agent_metadata"]["surface_hash"] == surface_hash()


def test_the_committed_snapshot_is_the_command_tables_surface():
    """The drift check: docs/schema-surface.json is what `evq schema --all` describes (the output
    schemas through the surface's hash). A change to the table, a help text, a parameter or an
    output schema that is not regenerated fails here, with the command that regenerates it."""
    committed = (ROOT / SNAPSHOT).read_text()
    current = surface()
    if committed != current:
        diff = "".join(
            list(difflib.unified_diff(committed.splitlines(True), current.splitlines(True), SNAPSHOT, "now"))[:60]
        )
        pytest.fail(f"{SNAPSHOT} is not the command table's surface; regenerate it with\n    {REGENERATE}\n\n{diff}")
    assert f"`{REGENERATE}`" in (ROOT / "CONTRIBUTING.md").read_text()  # where a contributor finds it


def test_the_surface_hash_changes_with_anything_described(monkeypatch):
    """One word of one tool's help is another surface, so an agent that cached the last one
    knows to read it again; and the same table is the same hash, run after run."""
    from dataclasses import replace

    before = surface_hash()
    surface_hash.cache_clear()
    assert surface_hash() == before
    entry = COMMANDS["steps.show"]
    monkeypatch.setitem(table.COMMANDS, "steps.show", replace(entry, summary=entry.summary + " Now."))
    surface_hash.cache_clear()
    try:
        assert surface_hash() != before
    finally:
        monkeypatch.undo()
        surface_hash.cache_clear()
    assert surface_hash() == before


def test_a_cli_path_is_only_a_command_line():
    """--cli-path takes the words one types after `evq`: a canonical path, a product or nothing
    that runs is not found, and it is one way of naming a tool, not a second one."""
    for words in ("steps.resolve", "steps", "steps frobnicate"):
        done = CliRunner().invoke(cli, ["schema", "--cli-path", words, "-o", "json"])
        body = json.loads(done.output)
        contract.check(("schema",), body)
        assert done.exit_code == 1 and body["error"]["code"] == "E_NOT_FOUND", words
    both = CliRunner().invoke(cli, ["schema", "steps.show", "--cli-path", "steps resolve", "-o", "json"])
    assert both.exit_code == 2 and json.loads(both.output)["error"]["code"] == "E_INVALID_ARG"
    assert schema("--cli-path", "  steps   resolve ") == schema("steps.resolve")


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


def test_no_hidden_command_is_listed_and_every_alias_is_the_same_tool(catalogue):
    listed = {t["cli_path"] for t in tools(catalogue)}
    aliases = {a: t for t in tools(catalogue) for a in t["aliases"]}
    every = [path for path, _ in leaf_commands(cli, hidden=True)]
    # The hidden leaves are exactly the aliases, each under the tool it runs.
    assert len(every) == len(listed) + len(aliases)
    for alias in aliases:
        words = alias.split()
        assert cli.commands[words[0]].hidden or find(cli, alias).hidden, alias


def test_every_tool_says_how_carefully(catalogue):
    for t in tools(catalogue):
        if t["needs_confirmation"]:
            assert "dry-run" in t["parameters"], t["canonical_path"]
        if t["effect"] == "read":
            assert t["risk"] == "low", t["canonical_path"]
        interfaces = t["interfaces"]
        assert interfaces["cli"] == f"evq {t['cli_path']}"
        # A command without an HTTP route or an MCP tool says why.
        assert bool(interfaces["http"] and interfaces["mcp"]) or interfaces["local_only"], t["canonical_path"]
        if interfaces["mcp"]:
            assert interfaces["mcp"] == "evq_" + re.sub("[.-]", "_", t["canonical_path"])
        if interfaces["http"]:
            assert interfaces["http"][0]["operation_id"] == t["canonical_path"]


def _json_type(kind: click.ParamType) -> str:
    if isinstance(kind, click.types.IntParamType):
        return "integer"
    if isinstance(kind, click.types.FloatParamType):
        return "number"
    assert isinstance(kind, click.types.StringParamType), kind
    return "string"
