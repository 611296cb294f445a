"""What `evq schema` says about a command: its entry in the command table
(ops/app/commands.py), from which the click command is built too (ops/cli/table.py),
and its output schema in ops/app/cli-schema/, so the description cannot drift from
what the command accepts and prints.
"""

from __future__ import annotations

from typing import Any

from evq.ops.app.commands import Command, Kind, Param
from evq.ops.app.schemas import output_schema
from evq.ops.cli.table import help_text


def usage(entry: Command) -> str:
    """As click writes it: ``evq steps resolve [OPTIONS] [STEP_ID]``."""
    pieces = [f"evq {entry.words}", "[OPTIONS]"]
    for p in entry.params:
        if p.kind is Kind.ARGUMENT:
            name = p.dest.upper()
            piece = name if p.required else f"[{name}]"
            pieces.append(piece + ("..." if p.repeatable else ""))
    return " ".join(pieces)


def describe_command(entry: Command) -> dict[str, Any]:
    key = next((p for p in entry.params if p.dest == "credential"), None)
    return {
        "command": entry.path,
        "usage": usage(entry),
        "summary": entry.summary,
        "help": help_text(entry),
        "effect": str(entry.effect),
        "writes": entry.permission is not None,
        "api_key": None
        if key is None
        else {"flag": key.flag, "env": key.env, "roles": entry.roles, "not_needed_with": "--dry-run"},
        "parameters": [describe_param(p) for p in entry.params],
        "output_schema": output_schema(entry.path),
    }


def describe_param(p: Param) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": p.flag if p.kind is not Kind.ARGUMENT else p.dest.upper(),
        "flags": list(p.flags),
        "dest": p.dest,
        "kind": str(p.kind),
        "required": p.required,
        "multiple": p.repeatable,
        "default": list(p.default) if p.repeatable else p.default,
        "envvar": p.env,
        "help": p.help or None,
        "type": p.type,
    }
    if p.enum:
        entry["enum"] = list(p.enum)
    if p.minimum is not None:
        entry["minimum"] = p.minimum
    if p.maximum is not None:
        entry["maximum"] = p.maximum
    return entry
