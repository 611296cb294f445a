"""The schemas the HTTP API and the MCP server publish come from the command table the CLI is built from,
and what they say is what is accepted."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from evq.ops.app.schemas import check_arguments, command_input, request_schema
from evq.worker.errors import InvalidRequest
from evq.worker.request import DECISION_FIELDS, REQUEST_FIELDS


def test_the_request_schema_names_exactly_the_fields_the_validator_takes():
    schema = request_schema()
    Draft202012Validator.check_schema(schema)
    assert set(schema["properties"]) == set(REQUEST_FIELDS)
    assert set(schema["properties"]["decision"]["properties"]) == set(DECISION_FIELDS)
    assert schema["additionalProperties"] is False


def test_command_parameters_as_json():
    schema = command_input("steps.resolve")
    Draft202012Validator.check_schema(schema)
    props = schema["properties"]
    assert props["as"]["enum"] == ["accepted", "rejected", "retry"] and {"as", "note"} <= set(schema["required"])
    assert props["older_than"]["description"].startswith("Only rows older")
    assert props["status"] == {
        "type": "array",
        "items": {"type": "string", "enum": ["unknown"]},
        "description": props["status"]["description"],
    }
    assert "credential" not in props and "api_key" not in props and "database_url" not in props


@pytest.mark.parametrize(
    ("arguments", "fields"),
    [
        ({"limit": True}, {"limit"}),
        ({"limit": 0}, {"limit"}),
        ({"limit": 2**40}, {"limit"}),
        ({"offset": -1, "nope": 1}, {"offset", "nope"}),
        ({"status": "unknown"}, {"status"}),
        ({"status": ["lost"]}, {"status"}),
        ({"run_id": "a\x00b"}, {"run_id"}),
        ({"run_id": "\ud800"}, {"run_id"}),
    ],
)
def test_check_arguments_refuses_what_the_schema_refuses(arguments, fields):
    schema = command_input("steps.list")
    with pytest.raises(InvalidRequest) as caught:
        check_arguments(schema, arguments)
    assert {f["field"] for f in caught.value.errors} == fields
    validator = Draft202012Validator(schema)
    if (
        not any(isinstance(v, str) and ("\x00" in v or "\ud800" in v) for v in arguments.values())
        and "limit" not in fields
    ):
        assert not validator.is_valid(arguments)


def test_check_arguments_fills_defaults():
    assert check_arguments(command_input("steps.list"), {})["limit"] == 50
    assert check_arguments(command_input("steps.list"), {"status": ["unknown"]})["status"] == ["unknown"]
