"""evq schema: the command surface, disclosed a level at a time.

evq schema                   the command groups (and the error codes)
evq schema steps             the commands of a group
evq schema steps.resolve     one command: its parameters and output schema
evq schema --all             every command at once
"""

from __future__ import annotations

from typing import Any

import click

from evq.ops.cli.common import command, output_option
from evq.ops.cli.describe import describe_command, find, leaf_commands, summary
from evq.ops.cli.output import EXIT_CODES, EXIT_INTERRUPTED, SCHEMA_VERSION, Output, table
from evq.worker.errors import NotFound

NEXT = "evq schema GROUP | evq schema GROUP.COMMAND | evq schema --all"


@click.command("schema")
@click.argument("name", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every command with its parameters and output schema.")
@output_option
@command
def schema(out: Output, name: tuple[str, ...], everything: bool) -> None:
    """Describe evq's commands for scripts and agents: groups, then a group's
    commands, then one command's parameters (flags, types, defaults, choices)
    and the JSON Schema of its output.

    \b
    evq schema -o json
    evq schema steps -o json
    evq schema steps.resolve -o json      (or: evq schema steps resolve)
    """
    root = click.get_current_context().find_root().command
    assert isinstance(root, click.Group)
    path = ".".join(part for word in name for part in word.replace(".", " ").split())
    if everything:
        commands = [describe_command(p, c) for p, c in leaf_commands(root)]
        out.success({"level": "all", "commands": commands, "exit_codes": _exit_codes()}, human=_human_all)
        return
    if not path:
        out.success(_root(root), human=_human_root)
        return
    cmd = find(root, path)
    if cmd is None:
        raise NotFound(f"no command {path.replace('.', ' ')!r}", hint="`evq schema` lists the groups")
    if isinstance(cmd, click.Group):
        out.success(
            {
                "level": "group",
                "group": path,
                "summary": summary(cmd),
                "commands": [_entry(f"{path}.{p}", c) for p, c in leaf_commands(cmd)],
                "next": NEXT,
            },
            human=_human_group,
        )
        return
    out.success({"level": "command", **describe_command(path, cmd)}, human=_human_command)


def _entry(path: str, cmd: click.Command) -> dict[str, Any]:
    return {"name": path, "kind": "group" if isinstance(cmd, click.Group) else "command", "summary": summary(cmd)}


def _root(root: click.Group) -> dict[str, Any]:
    return {
        "level": "root",
        "schema_version": SCHEMA_VERSION,
        "groups": [_entry(name, root.commands[name]) for name in sorted(root.commands)],
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
