"""What `evq schema` says about a command, read from the click objects themselves
(flags, types, defaults, choices) and from its output schema in ops/app/cli-schema/,
so the description cannot drift from what the command accepts and prints.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

import click

from evq.ops.cli.auth import ApiKeyOption
from evq.ops.cli.common import DocumentedOption

COMMON = "_common.schema.json"
_COMMON_REF = f'"{COMMON}#/$defs/'


def schema_dir() -> Traversable:
    # The package owns the files (ops/app/cli-schema links here), so an installed evq carries them.
    return resources.files("evq.ops.app").joinpath("cli-schema")


@cache
def load(name: str) -> dict[str, Any]:
    return json.loads(schema_dir().joinpath(name).read_text(encoding="utf-8"))


def schema_file(path: str) -> str:
    """``steps.resolve`` -> ``steps-resolve.schema.json``."""
    return path.replace(".", "-") + ".schema.json"


def output_schema(path: str) -> dict[str, Any]:
    """The command's output schema with the shared definitions folded in (one self-contained document)."""
    own = json.loads(json.dumps(load(schema_file(path))).replace(_COMMON_REF, '"#/$defs/'))
    own["$defs"] = {**load(COMMON)["$defs"], **own.get("$defs", {})}
    return own


def leaf_commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    for name in sorted(group.commands):
        cmd = group.commands[name]
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            yield from leaf_commands(cmd, path + ".")
        else:
            yield path, cmd


def find(root: click.Group, path: str) -> click.Command | None:
    cmd: click.Command | None = root
    for part in path.split("."):
        cmd = cmd.commands.get(part) if isinstance(cmd, click.Group) else None
    return cmd


def summary(cmd: click.Command) -> str:
    return cmd.get_short_help_str(limit=200)


def describe_command(path: str, cmd: click.Command) -> dict[str, Any]:
    words = path.replace(".", " ")
    with click.Context(cmd, info_name=f"evq {words}") as ctx:
        usage = f"evq {words} " + " ".join(cmd.collect_usage_pieces(ctx))
    key = next((p for p in cmd.params if isinstance(p, ApiKeyOption)), None)
    return {
        "command": path,
        "usage": usage.strip(),
        "summary": summary(cmd),
        "help": inspect.cleandoc(cmd.help or "").replace("\b\n", ""),
        "writes": key is not None,
        "api_key": None
        if key is None
        else {"flag": key.opts[0], "env": key.envvar, "roles": key.roles, "not_needed_with": "--dry-run"},
        "parameters": [describe_param(p) for p in cmd.params if p.name != "help"],
        "output_schema": output_schema(path),
    }


def describe_param(p: click.Parameter) -> dict[str, Any]:
    is_option = isinstance(p, click.Option)
    flag = is_option and p.is_flag  # type: ignore[union-attr]
    entry: dict[str, Any] = {
        "name": _primary(p) if is_option else p.human_readable_name,
        "flags": [*p.opts, *p.secondary_opts] if is_option else [],
        "dest": p.name,
        "kind": "flag" if flag else "option" if is_option else "argument",
        "required": p.required,
        "multiple": bool(p.multiple or p.nargs == -1),
        "default": _default(p, flag),
        "envvar": getattr(p, "documented_envvar", None) or (p.envvar if isinstance(p.envvar, str) else None),
        "help": getattr(p, "help", None),
        **_type(p, flag),
    }
    return entry


def _primary(p: click.Parameter) -> str:
    longs = [o for o in p.opts if o.startswith("--")]
    return longs[0] if longs else p.opts[0]


def _default(p: click.Parameter, flag: bool) -> Any:
    if isinstance(p, DocumentedOption):
        return p.documented_default
    default = p.default
    if flag:
        return default is True
    if isinstance(default, (list, tuple)):
        return list(default)
    if isinstance(default, (str, int, float)):
        return default
    # No default (None, or click's own "unset" marker): nothing, or an empty list for a repeatable one.
    return [] if p.multiple or p.nargs == -1 else None


def _type(p: click.Parameter, flag: bool) -> dict[str, Any]:
    t = p.type
    if flag:
        return {"type": "boolean"}
    if isinstance(t, click.Choice):
        return {"type": "string", "enum": list(t.choices)}
    if isinstance(t, (click.IntRange, click.FloatRange)):
        out: dict[str, Any] = {"type": "integer" if isinstance(t, click.IntRange) else "number"}
        if t.min is not None:
            out["minimum"] = t.min
        if t.max is not None:
            out["maximum"] = t.max
        return out
    if t is click.INT:
        return {"type": "integer"}
    if t is click.FLOAT:
        return {"type": "number"}
    return {"type": "string"}
