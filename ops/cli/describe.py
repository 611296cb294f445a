"""What `evq schema` says about a command: its entry in the command table
(ops/app/commands/), from which the click command is built too (ops/cli/table.py),
and its output schema in ops/app/cli-schema/, so the description cannot drift from
what the command accepts and prints.

The shape is the flat leaf agent CLIs converge on (``dws schema``, ``gws schema``): a stable
``canonical_path``, the executable ``cli_path``, ``aliases``, and ``parameters`` keyed by the
real flag name without ``--`` (an argument by its metavar, ``STEP_ID``), each with the
``property`` an HTTP body or MCP arguments name it by, ``required`` (always) and
``required_when`` (a condition a caller can evaluate: unless one of ``unless_any`` is given,
or ``unless_env`` is set).

Beside them, the schema contract's identity and provenance: ``path`` (the canonical path again, as
that contract names it), ``product_id`` (evq's command group: the contract's products are evq's
groups), ``source`` (``mcp:<product>`` for a tool `evq admin mcp` serves; ``hardcoded:<product>``
for a command-line helper, the contract's name for a visible local tool), and in the detail
``effect_source`` and ``agent_source_refs``: where the effect and the rest of the agent metadata
were declared (the command table entry, the output schema, the help).
"""

from __future__ import annotations

from typing import Any

from evq.ops.app.commands import CREDENTIAL, SOURCES, Command, Kind, Param
from evq.ops.app.schemas import output_schema, schema_file
from evq.ops.cli.table import help_text


def usage(entry: Command) -> str:
    """As click writes it: ``evq steps resolve [OPTIONS] [STEP_ID]``."""
    pieces = [f"evq {entry.words}", "[OPTIONS]"]
    for p in entry.params:
        if p.kind is Kind.ARGUMENT:
            name = p.key
            piece = name if p.required else f"[{name}]"
            pieces.append(piece + ("..." if p.repeatable else ""))
    return " ".join(pieces)


# Where every tool's effect is declared: the command table, reviewed with the command (the
# contract's effect_source; evq never infers an effect from a command's name).
EFFECT_SOURCE = "command_table"


def source(entry: Command) -> str:
    """The contract's ``source``: served by `evq admin mcp` (``mcp:<product>``), or a visible
    command-line helper (``hardcoded:<product>``; ``interfaces.local_only`` says why)."""
    return f"{'mcp' if entry.mcp else 'hardcoded'}:{entry.group}"


def agent_source_refs(entry: Command) -> list[str]:
    """Where a tool's agent metadata comes from, as paths in evq's source tree and the help."""
    return [
        f"{SOURCES[entry.path]}#{entry.path}",
        f"ops/app/cli-schema/{schema_file(entry.path)}",
        f"cli:evq {entry.words} --help",
    ]


def summarize(entry: Command, *, through: str | None = None) -> dict[str, Any]:
    """A tool as a product lists it; ``through``: the alias it was looked up by."""
    params = parameters(entry)
    return {
        "name": entry.action,
        "canonical_path": entry.path,
        "path": entry.path,
        "product_id": entry.group,
        "source": source(entry),
        "cli_path": through or entry.words,
        "primary_cli_path": entry.words,
        "aliases": list(entry.aliases),
        "is_alias": through is not None,
        "summary": entry.summary,
        "use_when": entry.use_when,
        "avoid_when": entry.avoid_when,
        "effect": str(entry.effect),
        "risk": str(entry.risk),
        "needs_confirmation": entry.confirm,
        "dry_run": any(p.dest == "dry_run" for p in entry.params),
        "has_parameters": bool(params),
        "parameter_count": len(params),
    }


def describe_command(entry: Command, *, through: str | None = None) -> dict[str, Any]:
    """One tool, flat and complete."""
    key = next((p for p in entry.params if p.dest == CREDENTIAL), None)
    params = parameters(entry)
    return {
        **summarize(entry, through=through),
        "usage": usage(entry),
        "help": help_text(entry),
        "examples": list(entry.examples),
        "effect_source": EFFECT_SOURCE,
        "agent_source_refs": agent_source_refs(entry),
        "writes": entry.permission is not None,
        "api_key": None
        if key is None
        else {
            "flag": key.flag,
            "env": key.env,
            "roles": entry.roles,
            # Only a command that has --dry-run can be tried without its key.
            "not_needed_with": "--dry-run" if any(p.dest == "dry_run" for p in entry.params) else None,
        },
        "interfaces": {
            "cli": f"evq {entry.words}",
            "http": [{"method": r.method, "path": r.path, "operation_id": entry.operation_id(r)} for r in entry.http],
            "mcp": entry.mcp_tool,
            "local_only": entry.local_only or None,
        },
        "parameters": params,
        "output_schema": output_schema(entry.path),
    }


def parameters(entry: Command) -> dict[str, Any]:
    by_dest = {p.dest: p for p in entry.params}
    return {p.key: describe_param(p, by_dest) for p in entry.params}


def describe_param(p: Param, by_dest: dict[str, Param]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": str(p.kind),
        "flags": list(p.flags),
        # The command line's own (the key, the output format, the database URL): no JSON name.
        "property": None if p.local else p.property,
        "type": p.type,
        "description": p.help,
        "required": p.required,
        "multiple": p.repeatable,
    }
    if p.unless or p.unless_env:
        condition: dict[str, Any] = {"unless_any": [by_dest[d].key for d in p.unless]}
        if p.unless_env:
            condition["unless_env"] = p.unless_env
        condition["description"] = p.required_text
        out["required_when"] = condition
    # A default is shown when it says something: not "nothing", not a flag's off.
    if p.default not in (None, (), False, ""):
        out["default"] = list(p.default) if p.repeatable else p.default
    if p.enum:
        out["enum"] = list(p.enum)
    if p.minimum is not None:
        out["minimum"] = p.minimum
    if p.maximum is not None:
        out["maximum"] = p.maximum
    if p.max_length is not None:
        out["max_length"] = p.max_length
    if p.env:
        out["env"] = p.env
    if p.example is not None:
        out["example"] = p.example
    return out
