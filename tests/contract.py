"""The JSON contract as the tests check it: every `-o json` output validated
against its command's schema in docs/cli-schema/ (jsonschema + referencing)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import click
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "docs" / "cli-schema"
validated: set[tuple[str, str]] = set()


def leaf_commands(group: click.Group, prefix: str = "", *, hidden: bool = False) -> Iterator[tuple[str, click.Command]]:
    """Every leaf of the real click tree by its canonical path (``steps.resolve``; ``schema`` is
    ``schema.show``); ``hidden``: the aliases too (under the canonical path they run)."""
    from evq.ops.app.commands import lookup

    for name in sorted(group.commands):
        cmd = group.commands[name]
        if cmd.hidden and not hidden:
            continue
        if isinstance(cmd, click.Group):
            yield from leaf_commands(cmd, f"{prefix}{name} ", hidden=hidden)
        else:
            found = lookup(prefix + name)
            assert found is not None, f"`evq {prefix}{name}` is not in the command table"
            yield found[0].path, cmd


@cache
def registry() -> Registry:
    return Registry().with_resources(
        (path.name, DRAFT202012.create_resource(json.loads(path.read_text()))) for path in SCHEMA_DIR.glob("*.json")
    )


@cache
def validator(path: str) -> Draft202012Validator:
    doc = json.loads((SCHEMA_DIR / (path.replace(".", "-") + ".schema.json")).read_text())
    return Draft202012Validator(doc, registry=registry())


def command_path(args: tuple[str, ...]) -> str:
    """The command an argument list runs, by canonical path: ``("steps", "show", "7")`` ->
    ``steps.show``, ``("enqueue", ...)`` (an alias) -> ``steps.enqueue``."""
    from evq.ops.app.commands import lookup
    from evq.ops.cli import cli

    cmd: click.Command = cli
    parts: list[str] = []
    for arg in args:
        if not isinstance(cmd, click.Group) or arg not in cmd.commands:
            break
        cmd = cmd.commands[arg]
        parts.append(arg)
    found = lookup(" ".join(parts))
    return found[0].path if found else ".".join(parts)


def check(args: tuple[str, ...], out: dict[str, Any]) -> None:
    path = command_path(args)
    errors = sorted(validator(path).iter_errors(out), key=lambda e: list(e.absolute_path))
    assert not errors, f"{path}: output does not match its schema: " + "; ".join(
        f"{list(e.absolute_path)}: {e.message[:300]}" for e in errors[:5]
    )
    validated.add((path, out["status"]))
