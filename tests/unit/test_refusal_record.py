"""What a refusal record keeps of a hostile request: no address, no caller text as a name."""

from __future__ import annotations

import json

from evq.worker.refusals import describe


def test_unknown_field_names_and_a_provider_that_is_no_name_are_not_kept_verbatim():
    request = {"run_id": "r", "step_id": "s", "provider": "SECRETPROV bob@x.com", "bob@private.example": 1}
    errors = [
        {"field": "bob@private.example", "message": "unknown field"},
        {"field": "provider", "message": "not a provider name"},
    ]
    record = describe("http", [request], errors, key_name="agent")
    kept = json.dumps({"errors": record.errors, "asked": record.asked})
    assert "bob@" not in kept and "SECRETPROV" not in kept, kept
    assert record.errors[0]["field"] == "(unknown field)" and record.error_count == 2
    assert record.asked[0]["provider"] == "(not a provider name)"
    assert record.asked[0]["fields"] == ["(unknown field)", "provider", "run_id", "step_id"]
    # A real provider name and the known fields stay, so an operator still sees what was asked.
    ok = describe("http", [{"run_id": "r", "step_id": "s", "provider": "smtp"}], errors[1:], key_name=None)
    assert ok.asked[0]["provider"] == "smtp" and ok.errors[0]["field"] == "provider"
