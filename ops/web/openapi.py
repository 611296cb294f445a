"""The OpenAPI document's schemas, taken from ops/app/cli-schema (the same files `evq schema`
serves and the tests validate every CLI output against), hoisted into
``components/schemas`` so every ``$ref`` resolves inside the one document."""

from __future__ import annotations

import json
from typing import Any

from evq.ops.app.schemas import COMMON, load, schema_file

REF = "#/components/schemas/"


def _rewrite(node: Any, own: dict[str, str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out[key] = _ref(value, own)
            elif key != "$schema":
                out[key] = _rewrite(value, own)
        return out
    if isinstance(node, list):
        return [_rewrite(item, own) for item in node]
    return node


def _ref(value: str, own: dict[str, str]) -> str:
    if value.startswith(f"{COMMON}#/$defs/"):
        return REF + value.split("/")[-1]
    if value.startswith("#/$defs/"):
        return REF + own[value.split("/")[-1]]
    raise ValueError(f"unexpected $ref {value!r}")


def component_name(command: str) -> str:
    """``steps.resolve`` -> ``steps_resolve_response``."""
    return command.replace(".", "_") + "_response"


def components(commands: list[str]) -> dict[str, Any]:
    """The shared definitions plus, per command, its own definitions and its whole output."""
    schemas: dict[str, Any] = {}
    common = load(COMMON)["$defs"]
    for name, definition in common.items():
        schemas[name] = _rewrite(definition, {n: n for n in common})
    for command in commands:
        doc = json.loads(json.dumps(load(schema_file(command))))
        prefix = command.replace(".", "_")
        own_defs = doc.pop("$defs", {})
        own = {name: f"{prefix}_{name}" for name in own_defs}
        for name, definition in own_defs.items():
            schemas[own[name]] = _rewrite(definition, own)
        schemas[component_name(command)] = _rewrite(doc, own)
    return schemas


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF + name}
