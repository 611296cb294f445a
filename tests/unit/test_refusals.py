"""What a refused enqueue keeps (worker/refusals.py): bounded, scrubbed, never the body."""

from __future__ import annotations

import hashlib
import json

from evq.worker.logs import register_secrets
from evq.worker.refusals import MAX_ASKED, MAX_ERRORS, MAX_MESSAGE, describe, reason


def test_reasons_are_the_request_fields_roots_whatever_the_index():
    assert [reason(f) for f in ("to[2]", "[3].to[0]", "decision.model", "[0].$", "x", "headers.X")] == [
        "to",
        "to",
        "decision",
        "$",
        "unknown_field",
        "headers",
    ]


def test_the_body_and_addresses_are_not_kept_only_identifiers_and_a_digest():
    asked = {"run_id": "r", "step_id": "s", "to": ["a@b.example", "c@d.example"], "text": "private words"}
    made = describe("http", [asked], [{"field": "subject", "message": "required"}], key_name="bot")
    kept = json.dumps([made.asked, made.errors])
    assert "private words" not in kept and "a@b.example" not in kept
    assert made.asked == [
        {"run_id": "r", "step_id": "s", "fields": ["run_id", "step_id", "text", "to"], "recipients": 2}
    ]
    text = json.dumps([asked], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert made.request_sha256 == hashlib.sha256(text).hexdigest() and made.request_bytes == len(text)


def test_errors_and_requests_are_bounded_and_secrets_scrubbed():
    register_secrets(["hunter2-very-secret"])
    errors = [{"field": f"to[{i}]", "message": "x" * 1000 + " hunter2-very-secret"} for i in range(200)]
    made = describe("cli", [{"run_id": "r"}] * 100 + ["not an object"], errors, key_name=None)
    assert len(made.errors) == MAX_ERRORS and made.error_count == 200 and made.reasons == ["to"]
    assert all(len(e["message"]) <= MAX_MESSAGE for e in made.errors)
    assert len(made.asked) == MAX_ASKED and made.requests == 101
    made = describe(
        "cli", [{"step_id": "hunter2-very-secret"}], [{"field": "x", "message": "hunter2-very-secret"}], key_name=None
    )
    assert "hunter2-very-secret" not in json.dumps([made.asked, made.errors])
