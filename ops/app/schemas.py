"""JSON Schemas of what the commands take and print, built from the command table
(ops/app/commands/) the command line is built from, so no interface describes a
parameter differently:

- :func:`request_schema`: the send request, from ops/app/service/common.py's field table (the
  flags of `evq enqueue` come from the same table). worker/request.py stays the one
  validator of a request; the schema tells callers its shape.
- :func:`command_input`: a command's parameters as a JSON object (the HTTP API's bodies,
  the MCP tools' arguments), each under its JSON property (``--older-than`` is
  ``older_than``). :func:`check_arguments` validates against it, so what a schema says
  is exactly what is accepted.
- :func:`output_schema`: a command's output (the files in ops/app/cli-schema, package
  data), self-contained.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from evq.ops.app.commands import command
from evq.ops.app.service import (
    DECISION_FIELDS,
    HEADERS_HELP,
    MAX_ATTEMPTS_HELP,
    PRIORITY_HELP,
    REQUEST_FIELDS,
    REQUIRE_APPROVAL_HELP,
    SEND_AT_HELP,
)
from evq.worker.approval_policy import PRIORITIES
from evq.worker.errors import InvalidRequest
from evq.worker.request import ALLOWED_HEADERS, MAX_IDENTIFIER

_ADDRESS: dict[str, Any] = {
    "anyOf": [
        {"type": "string", "description": "'addr@domain' or 'Name <addr@domain>'"},
        {
            "type": "object",
            "properties": {"email": {"type": "string"}, "name": {"type": "string"}},
            "required": ["email"],
            "additionalProperties": False,
        },
    ]
}
_IDENTIFIERS = {"run_id", "step_id", "idempotency_key"}
_REQUIRED = ("run_id", "step_id", "to", "subject")


def request_schema() -> dict[str, Any]:
    """The send request every interface takes (docs/reference/request.md)."""
    properties: dict[str, Any] = {}
    for name, multiple, help_text in REQUEST_FIELDS:
        if multiple:
            prop: dict[str, Any] = {"type": "array", "items": _ADDRESS}
        elif name in ("from", "notify"):
            prop = {**_ADDRESS}
        elif name in _IDENTIFIERS:
            prop = {"type": "string", "minLength": 1, "maxLength": MAX_IDENTIFIER}
        else:
            prop = {"type": "string"}
        properties[name] = {**prop, "description": help_text}
    decision = {
        name: ({"description": help_text} if name == "rationale" else {"type": "string", "description": help_text})
        for name, help_text in DECISION_FIELDS
    }
    decision["rationale"]["anyOf"] = [{"type": "string"}, {"type": "object"}, {"type": "array"}]
    properties["decision"] = {
        "type": "object",
        "description": "The agent's decision behind this send.",
        "properties": decision,
        "additionalProperties": False,
    }
    properties["headers"] = {
        "type": "object",
        "description": HEADERS_HELP,
        "propertyNames": {"enum": sorted(ALLOWED_HEADERS.values())},
        "additionalProperties": {"type": "string"},
    }
    properties["max_attempts"] = {"type": "integer", "minimum": 1, "maximum": 100, "description": MAX_ATTEMPTS_HELP}
    properties["require_approval"] = {"type": "boolean", "description": REQUIRE_APPROVAL_HELP}
    properties["send_at"] = {"type": "string", "format": "date-time", "description": SEND_AT_HELP}
    properties["priority"] = {"enum": list(PRIORITIES), "description": PRIORITY_HELP}
    return {
        "type": "object",
        "title": "send request",
        "description": "One email send. Validation refuses unknown fields, bad addresses, CR/LF in the subject or a "
        "header, a missing body, and recipients outside the allowed domains; nothing is written then.",
        "properties": properties,
        "required": list(_REQUIRED),
        "additionalProperties": False,
    }


def command_input(
    path: str,
    *,
    exclude: Iterable[str] = (),
    rename: Mapping[str, str] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The parameters of command ``path`` (e.g. ``steps.list``) as one JSON object schema.

    Each is named by its JSON property, then ``rename``d (by dest); ``exclude`` names
    dests. The API key, the output format and the database URL (``local`` parameters)
    are the server's business.
    """
    skipped = set(exclude)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in command(path).params:
        if param.local or param.dest in skipped:
            continue
        name = (rename or {}).get(param.dest) or param.property
        prop: dict[str, Any] = {"type": param.type}
        if param.enum:
            prop["enum"] = list(param.enum)
        if param.minimum is not None:
            prop["minimum"] = param.minimum
        if param.maximum is not None:
            prop["maximum"] = param.maximum
        if param.max_length is not None:
            prop["maxLength"] = param.max_length
        if param.repeatable:
            prop = {"type": "array", "items": prop}
        default = (defaults or {}).get(name, param.default)
        if default not in (None, [], ()):
            prop["default"] = default
        if param.help:
            prop["description"] = param.help
        properties[name] = prop
        if param.required:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "boolean": (bool,), "number": (int, float)}


def check_arguments(schema: Mapping[str, Any], arguments: Any) -> dict[str, Any]:
    """``arguments`` checked against a :func:`command_input` schema, defaults filled in;
    InvalidRequest naming every failing field otherwise."""
    if not isinstance(arguments, Mapping):
        raise InvalidRequest([{"field": "$", "message": "expected a JSON object"}])
    errors: list[dict[str, str]] = []
    properties = schema["properties"]
    for name in arguments:
        if name not in properties:
            errors.append({"field": str(name)[:100], "message": "unknown field"})
    for name in schema["required"]:
        if arguments.get(name) is None:
            errors.append({"field": name, "message": "required"})
    out: dict[str, Any] = {}
    for name, prop in properties.items():
        value = arguments.get(name)
        if value is None:
            out[name] = prop.get("default")
            continue
        problem = _problem(prop, value)
        if problem:
            errors.append({"field": name, "message": problem})
        out[name] = value
    if errors:
        raise InvalidRequest(errors, hint="nothing was changed")
    return out


def _problem(prop: Mapping[str, Any], value: Any) -> str | None:
    if prop["type"] == "array":
        if not isinstance(value, list):
            return "must be an array"
        return next((f"[{i}] {p}" for i, v in enumerate(value) if (p := _problem(prop["items"], v))), None)
    wanted = _TYPES[prop["type"]]
    if not isinstance(value, wanted) or (bool not in wanted and isinstance(value, bool)):
        return f"must be {'an' if prop['type'][0] in 'ai' else 'a'} {prop['type']}"
    if "enum" in prop and value not in prop["enum"]:
        return f"one of {', '.join(map(str, prop['enum']))}"
    if "minimum" in prop and value < prop["minimum"]:
        return f"at least {prop['minimum']}"
    if "maximum" in prop and value > prop["maximum"]:
        return f"at most {prop['maximum']}"
    if "maxLength" in prop and len(value) > prop["maxLength"]:
        return f"at most {prop['maxLength']} characters, got {len(value)}"
    if isinstance(value, int) and abs(value) > _MAX_INT:
        return f"at most {_MAX_INT}"
    if isinstance(value, str) and ("\x00" in value or len(value) > 10_000 or not _encodable(value)):
        return "at most 10000 characters of text, no NUL"
    return None


# Beyond this an integer is a mistake, not a page size; PostgreSQL would refuse it anyway.
_MAX_INT = 2**31 - 1


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- output schemas ------------------------------------------------------------

COMMON = "_common.schema.json"
_COMMON_REF = f'"{COMMON}#/$defs/'


def schema_dir() -> Traversable:
    # Package data (docs/cli-schema links here), so an installed evq carries them.
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
