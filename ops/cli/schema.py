"""evq schema: the command surface, disclosed a level at a time.

evq schema                   the groups, each with its tool_count (and the error codes); `evq schema list` too
evq schema steps             the tools of a group, as summaries
evq schema steps.resolve     one tool, flat: its parameters and output schema (`steps resolve`, an alias too)
evq schema --all             every group with every tool, complete
"""

from __future__ import annotations

from typing import Any

from evq.ops.app.commands import COMMANDS, GROUPS, in_group, lookup
from evq.ops.cli.common import command
from evq.ops.cli.describe import describe_command, summarize
from evq.ops.cli.output import EXIT_CODES, EXIT_INTERRUPTED, SCHEMA_VERSION, Output, table
from evq.ops.cli.table import from_table
from evq.worker.errors import NotFound

NEXT = "evq schema GROUP | evq schema GROUP.ACTION | evq schema --all"
OVERVIEW = ("", "list")  # `evq schema list`: the overview, as dws and gws spell it too


@from_table("schema.show")
@command
def schema(out: Output, name: tuple[str, ...], everything: bool) -> None:
    path = ".".join(part for word in name for part in word.replace(".", " ").split())
    if everything:
        out.success(_all(), human=_human_all)
        return
    if path in OVERVIEW:
        out.success(_root(), human=_human_root)
        return
    if path in GROUPS:
        tools = [summarize(c) for c in in_group(path)]
        out.success(
            {
                "level": "group",
                "group": path,
                "summary": GROUPS[path],
                "tool_count": len(tools),
                "tools": tools,
                "next": NEXT,
            },
            human=_human_group,
        )
        return
    found = lookup(path)
    if found is None:
        raise NotFound(f"no command {path.replace('.', ' ')!r}", hint="`evq schema` lists the groups")
    entry, is_alias = found
    through = " ".join(path.replace(".", " ").split()) if is_alias else None
    out.success({"level": "tool", **describe_command(entry, through=through)}, human=_human_command)


def _groups() -> list[tuple[str, list[Any]]]:
    return [(name, in_group(name)) for name in sorted(GROUPS)]


def _root() -> dict[str, Any]:
    return {
        "level": "groups",
        "schema_version": SCHEMA_VERSION,
        "tool_count": len(COMMANDS),
        "groups": [{"name": name, "summary": GROUPS[name], "tool_count": len(tools)} for name, tools in _groups()],
        "exit_codes": _exit_codes(),
        "next": NEXT,
    }


def _all() -> dict[str, Any]:
    return {
        "level": "all",
        "schema_version": SCHEMA_VERSION,
        "tool_count": len(COMMANDS),
        "groups": [
            {
                "name": name,
                "summary": GROUPS[name],
                "tool_count": len(tools),
                "tools": [describe_command(c) for c in tools],
            }
            for name, tools in _groups()
        ],
        "exit_codes": _exit_codes(),
    }


def _exit_codes() -> dict[str, int]:
    return {**EXIT_CODES, "interrupted": EXIT_INTERRUPTED}


def _human_codes(codes: dict[str, int]) -> str:
    return table([{"code": c, "exit": n} for c, n in codes.items()], [("code", "error code"), ("exit", "exit")])


def _human_root(d: dict[str, Any]) -> str:
    groups = table(d["groups"], [("name", "group"), ("tool_count", "tools"), ("summary", "summary")])
    return f"{groups}\n\n{_human_codes(d['exit_codes'])}\n\nmore: {d['next']}"


def _human_group(d: dict[str, Any]) -> str:
    rows = [{**t, "aliases": ", ".join(t["aliases"]) or None} for t in d["tools"]]
    columns = [("cli_path", "command"), ("effect", "effect"), ("risk", "risk"), ("aliases", "aliases")]
    return f"{d['group']}: {d['summary']}\n" + table(rows, [*columns, ("summary", "summary")])


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
    tools = [t for g in d["groups"] for t in g["tools"]]
    return "\n\n".join([*(_human_command(t) for t in tools), _human_codes(d["exit_codes"])])
