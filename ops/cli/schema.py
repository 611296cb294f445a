"""evq schema: the command surface, disclosed a level at a time.

evq schema                   the command groups (and the error codes)
evq schema steps             the commands of a group
evq schema steps.resolve     one command: its parameters and output schema
evq schema --all             every command at once
"""

from __future__ import annotations

from typing import Any

from evq.ops.app.commands import COMMANDS, GROUPS, in_group, top_level
from evq.ops.cli.common import command
from evq.ops.cli.describe import describe_command
from evq.ops.cli.output import EXIT_CODES, EXIT_INTERRUPTED, SCHEMA_VERSION, Output, table
from evq.ops.cli.table import from_table
from evq.worker.errors import NotFound

NEXT = "evq schema GROUP | evq schema GROUP.COMMAND | evq schema --all"


@from_table("schema")
@command
def schema(out: Output, name: tuple[str, ...], everything: bool) -> None:
    path = ".".join(part for word in name for part in word.replace(".", " ").split())
    if everything:
        described = [describe_command(c) for _, c in sorted(COMMANDS.items())]
        out.success({"level": "all", "commands": described, "exit_codes": _exit_codes()}, human=_human_all)
        return
    if not path:
        out.success(_root(), human=_human_root)
        return
    if path in COMMANDS:
        out.success({"level": "command", **describe_command(COMMANDS[path])}, human=_human_command)
        return
    if path not in GROUPS:
        raise NotFound(f"no command {path.replace('.', ' ')!r}", hint="`evq schema` lists the groups")
    out.success(
        {
            "level": "group",
            "group": path,
            "summary": GROUPS[path],
            "commands": [{"name": c.path, "kind": "command", "summary": c.summary} for c in in_group(path)],
            "next": NEXT,
        },
        human=_human_group,
    )


def _root() -> dict[str, Any]:
    groups = [
        {"name": name, "kind": "group", "summary": GROUPS[name]}
        if name in GROUPS
        else {"name": name, "kind": "command", "summary": COMMANDS[name].summary}
        for name in top_level()
    ]
    return {
        "level": "root",
        "schema_version": SCHEMA_VERSION,
        "groups": groups,
        "exit_codes": _exit_codes(),
        "next": NEXT,
    }


def _exit_codes() -> dict[str, int]:
    return {**EXIT_CODES, "interrupted": EXIT_INTERRUPTED}


def _human_codes(codes: dict[str, int]) -> str:
    return table([{"code": c, "exit": n} for c, n in codes.items()], [("code", "error code"), ("exit", "exit")])


def _human_root(d: dict[str, Any]) -> str:
    groups = table(d["groups"], [("name", "name"), ("kind", "kind"), ("summary", "summary")])
    return f"{groups}\n\n{_human_codes(d['exit_codes'])}\n\nmore: {d['next']}"


def _human_group(d: dict[str, Any]) -> str:
    return f"{d['group']}: {d['summary']}\n" + table(d["commands"], [("name", "command"), ("summary", "summary")])


def _human_command(d: dict[str, Any]) -> str:
    params = [{**p, "type": p["type"] + (f" {'|'.join(p['enum'])}" if p.get("enum") else "")} for p in d["parameters"]]
    lines = [d["usage"], "", d["help"], ""]
    if d["api_key"]:
        lines.append(f"needs an API key with role {' or '.join(d['api_key']['roles'])} (not with --dry-run)\n")
    lines.append(
        table(
            params,
            [
                ("name", "parameter"),
                ("type", "type"),
                ("required", "required"),
                ("default", "default"),
                ("help", "help"),
            ],
        )
    )
    lines.append("\noutput schema: evq schema " + d["command"] + " -o json")
    return "\n".join(lines)


def _human_all(d: dict[str, Any]) -> str:
    return "\n\n".join([*(_human_command(c) for c in d["commands"]), _human_codes(d["exit_codes"])])
