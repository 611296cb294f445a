"""evq schema: the command surface, disclosed a level at a time (the schema contract's
progressive disclosure; evq's command groups are its products).

evq schema                      the products, each with its tool_count and when to use it; what the
                                interfaces serve; the surface's hash (and the error codes); `evq schema list` too
evq schema steps                the tools of a product, as summaries
evq schema steps.resolve        one tool, flat: its parameters and output schema (`steps resolve`, an alias too)
evq schema --cli-path "steps resolve"   the same tool, named only by its command line
evq schema --all                every product with every tool, complete

Everything is built from the command table (ops/app/commands/) and the output schemas, never by
asking a running server: what is described is this evq, whatever the environment says.
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from typing import Any

from evq.ops.app.commands import CLI_PATHS, COMMANDS, GROUP_WHEN, GROUPS, Command, in_group, lookup
from evq.ops.cli.common import command
from evq.ops.cli.describe import describe_command, summarize
from evq.ops.cli.output import EXIT_CODES, EXIT_INTERRUPTED, SCHEMA_VERSION, Output, table
from evq.ops.cli.table import from_table
from evq.worker.errors import InvalidRequest, NotFound

NEXT = 'evq schema PRODUCT | evq schema PRODUCT.ACTION | evq schema --cli-path "PRODUCT ACTION" | evq schema --all'
OVERVIEW = ("", "list")  # `evq schema list`: the overview, as dws and gws spell it too
# The shape of agent_metadata itself; the surface it describes is versioned by its hash.
AGENT_METADATA_VERSION = 1
# Where everything is described from: the command table, one entry per tool.
SOURCE = "command_table"
# The committed snapshot of the surface (tests/unit/test_schema_disclosure.py fails when it is stale).
SNAPSHOT = "docs/schema-surface.json"
REGENERATE = f'python3 -c \'from evq.ops.cli.schema import surface; open("{SNAPSHOT}", "w").write(surface())\''


@from_table("schema.show")
@command
def schema(out: Output, name: tuple[str, ...], cli_path: str | None, everything: bool) -> None:
    path = ".".join(part for word in name for part in word.replace(".", " ").split())
    if cli_path is not None:
        if path or everything:
            raise InvalidRequest([{"field": "--cli-path", "message": "give NAME, --cli-path or --all, one of them"}])
        _tool(out, *_by_command_line(cli_path))
        return
    if everything:
        out.success(catalogue(), human=_human_all)
        return
    if path in OVERVIEW:
        out.success(_root(), human=_human_root)
        return
    if path in GROUPS:
        tools = [summarize(c) for c in in_group(path)]
        product = {"level": "product", "product_id": path, **_routing(path), "tool_count": len(tools)}
        out.success({**product, "tools": tools, "next": NEXT}, human=_human_product)
        return
    found = lookup(path)
    if found is None:
        raise NotFound(f"no command {path.replace('.', ' ')!r}", hint="`evq schema` lists the products")
    entry, is_alias = found
    _tool(out, entry, " ".join(path.replace(".", " ").split()) if is_alias else None)


def _by_command_line(words: str) -> tuple[Command, str | None]:
    """The tool at a command line as typed after `evq` (``steps resolve``, an alias ``enqueue``):
    only words, so a canonical path or a product is not taken for one."""
    line = " ".join(words.split())
    found = CLI_PATHS.get(line)
    if found is None:
        raise NotFound(
            f"no command line `evq {line}`", hint="`evq schema PRODUCT` lists each tool's cli_path and aliases"
        )
    entry, is_alias = found
    return entry, line if is_alias else None


def _tool(out: Output, entry: Command, through: str | None) -> None:
    out.success({"level": "tool", **describe_command(entry, through=through)}, human=_human_command)


def _routing(product: str) -> dict[str, str]:
    use_when, avoid_when = GROUP_WHEN[product]
    return {"summary": GROUPS[product], "use_when": use_when, "avoid_when": avoid_when}


def _products() -> list[tuple[str, list[Command]]]:
    return [(name, in_group(name)) for name in sorted(GROUPS)]


def _root() -> dict[str, Any]:
    return {
        "level": "products",
        "schema_version": SCHEMA_VERSION,
        "tool_count": len(COMMANDS),
        "products": [{"name": name, **_routing(name), "tool_count": len(tools)} for name, tools in _products()],
        "interface_metadata": interface_metadata(),
        "agent_metadata": agent_metadata(),
        "exit_codes": _exit_codes(),
        "next": NEXT,
    }


def _described() -> dict[str, Any]:
    """Everything `evq schema --all` describes, the metadata about it aside."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_count": len(COMMANDS),
        "products": [
            {
                "name": name,
                **_routing(name),
                "tool_count": len(tools),
                "tools": [describe_command(c) for c in tools],
            }
            for name, tools in _products()
        ],
        "exit_codes": _exit_codes(),
    }


def catalogue() -> dict[str, Any]:
    """`evq schema --all`: every product with every tool, complete."""
    described = _described()
    return {
        "level": "all",
        **described,
        "interface_metadata": interface_metadata(),
        "agent_metadata": agent_metadata(),
    }


def interface_metadata() -> dict[str, Any]:
    """What each interface serves of the surface, from the table (no server is asked)."""
    entries = list(COMMANDS.values())
    return {
        "source": SOURCE,
        "tools": len(entries),
        "cli_aliases": sum(len(c.aliases) for c in entries),
        "http_operations": sum(len(c.http) for c in entries),
        "mcp_tools": sum(1 for c in entries if c.mcp),
        "local_only": sum(1 for c in entries if c.local_only),
    }


def agent_metadata() -> dict[str, Any]:
    return {
        "source": SOURCE,
        "version": AGENT_METADATA_VERSION,
        "surface_hash": surface_hash(),
        "products": len(GROUPS),
        "tools": len(COMMANDS),
    }


@cache
def surface_hash() -> str:
    """A digest of everything described (every tool complete, its output schema included, the
    products, what the interfaces serve, the error codes): the same for the same evq on any
    machine, different as soon as anything an agent may have cached changes."""
    described = {**_described(), "interface_metadata": interface_metadata()}
    canonical = json.dumps(described, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def surface() -> str:
    """The committed snapshot (SNAPSHOT): `evq schema --all` without the output schemas, which are
    files of their own (ops/app/cli-schema/) and pinned here through the surface's hash."""
    everything = catalogue()
    for product in everything["products"]:
        for tool in product["tools"]:
            del tool["output_schema"]
    return json.dumps(everything, indent=2, ensure_ascii=False) + "\n"


def _exit_codes() -> dict[str, int]:
    return {**EXIT_CODES, "interrupted": EXIT_INTERRUPTED}


def _human_codes(codes: dict[str, int]) -> str:
    return table([{"code": c, "exit": n} for c, n in codes.items()], [("code", "error code"), ("exit", "exit")])


def _human_root(d: dict[str, Any]) -> str:
    products = table(d["products"], [("name", "product"), ("tool_count", "tools"), ("use_when", "use when")])
    surface = f"surface {d['agent_metadata']['surface_hash']}"
    return f"{products}\n\n{_human_codes(d['exit_codes'])}\n\n{surface}\nmore: {d['next']}"


def _human_product(d: dict[str, Any]) -> str:
    rows = [{**t, "aliases": ", ".join(t["aliases"]) or None} for t in d["tools"]]
    columns = [("cli_path", "command"), ("effect", "effect"), ("risk", "risk"), ("aliases", "aliases")]
    head = f"{d['product_id']}: {d['summary']}\nuse when: {d['use_when']}\navoid when: {d['avoid_when']}\n"
    return head + table(rows, [*columns, ("summary", "summary")])


def _human_command(d: dict[str, Any]) -> str:
    rows = [
        {
            "name": name,
            "type": p["type"] + (f" {'|'.join(p['enum'])}" if p.get("enum") else ""),
            "required": p["required"] or ("when" if "required_when" in p else False),
            "default": p.get("default"),
            "help": p["description"],
        }
        for name, p in d["parameters"].items()
    ]
    lines = [d["usage"], ""]
    if d["is_alias"]:
        lines += [f"`evq {d['cli_path']}` is an alias of `evq {d['primary_cli_path']}`.", ""]
    lines += [d["help"], "", f"use when: {d['use_when']}", f"avoid when: {d['avoid_when']}"]
    lines.append(f"effect: {d['effect']}, risk: {d['risk']}" + (", run with --dry-run first" * d["needs_confirmation"]))
    if d["aliases"]:
        lines.append("aliases: " + ", ".join(f"evq {a}" for a in d["aliases"]))
    lines.append("")
    if d["api_key"]:
        lines.append(f"needs an API key with role {' or '.join(d['api_key']['roles'])} (not with --dry-run)\n")
    columns = [("name", "parameter"), ("type", "type"), ("required", "required"), ("default", "default")]
    lines.append(table(rows, [*columns, ("help", "help")]))
    lines.append("\noutput schema: evq schema " + d["canonical_path"] + " -o json")
    return "\n".join(lines)


def _human_all(d: dict[str, Any]) -> str:
    tools = [t for p in d["products"] for t in p["tools"]]
    return "\n\n".join([*(_human_command(t) for t in tools), _human_codes(d["exit_codes"])])
