"""The request validator: every rule refuses with a clear, field-named error."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evq.worker.errors import InvalidRequest
from evq.worker.request import Policy, check_payload, parse
from tests.support import POLICY, request


def errors_of(data, policy=POLICY) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as err:
        parse(data, policy)
    assert err.value.code == "E_INVALID_ARG"
    return {e["field"]: e["message"] for e in err.value.context["fields"]}


def test_a_good_request_is_normalized_and_hashed():
    data = request(run_id="r", step_id="s", to=["Bob Smith <BOB@Example.COM>"], cc="c@example.com")
    v = parse(data, POLICY)
    assert v.idempotency_key == "r:s"
    assert v.payload["to"] == [{"email": "BOB@example.com", "name": "Bob Smith"}]
    assert v.payload["cc"] == [{"email": "c@example.com", "name": None}]
    assert len(v.payload_sha256) == 64
    # The same request hashes the same, whatever the key order.
    again = parse(dict(reversed(list(data.items()))), POLICY)
    assert again.payload_sha256 == v.payload_sha256


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"to": []}, "to", "at least one recipient"),
        ({"to": ["not-an-address"]}, "to[0]", "not a valid address"),
        ({"to": ["a@example.com, b@example.com"]}, "to[0]", "not a valid address"),
        ({"to": ["x <a@example.com> <b@example.com>"]}, "to[0]", "not a valid address"),
        ({"to": [{"email": "a@example.com", "name": "Eve\r\nBcc: x@evil.example"}]}, "to[0]", "control"),
        ({"to": "a@example.com", "cc": [42]}, "cc[0]", "must be an address"),
        ({"subject": "hi\r\nBcc: evil@example.com"}, "subject", "one line"),
        ({"subject": "   "}, "subject", "must not be empty"),
        ({"subject": "=?utf-8?q?x=0D=0ABcc:_evil@example.net?="}, "subject", "encoded words"),
        ({"to": ["=?utf-8?q?a=0D=0ABcc:_e@example.net?= <a@example.com>"]}, "to[0]", "encoded words"),
        ({"subject": None}, "subject", "required"),
        ({"text": None, "html": None}, "text", "text or html body"),
        ({"text": 5}, "text", "must be a string"),
        ({"run_id": None}, "run_id", "required"),
        ({"step_id": "a\x00b"}, "step_id", "control"),
        ({"step_id": "x" * 201}, "step_id", "longer than 200"),
        ({"step_id": " padded"}, "step_id", "leading or trailing"),
        ({"from": None}, "from", "required"),
        ({"headers": {"X-Mailer": "me"}}, "headers.X-Mailer", "not allowed"),
        ({"headers": {"In-Reply-To": "<a@b>\r\nBcc: x@y.com"}}, "headers.In-Reply-To", "CR, LF"),
        ({"headers": {"In-Reply-To": "<a@b>", "in-reply-to": "<c@d>"}}, "headers.in-reply-to", "given twice"),
        ({"decision": {"model": "m", "mood": "happy"}}, "decision.mood", "unknown field"),
        ({"decision": {"decided_at": "yesterday"}}, "decision.decided_at", "ISO 8601"),
        ({"decision": {"decided_at": "2026-01-01T10:00:00"}}, "decision.decided_at", "time zone"),
        ({"decision": "because"}, "decision", "must be an object"),
        ({"max_attempts": 0}, "max_attempts", "1 to 100"),
        ({"max_attempts": True}, "max_attempts", "1 to 100"),
        ({"provider": "carrier-pigeon"}, "provider", "unknown provider"),
        ({"surprise": 1}, "surprise", "unknown field"),
    ],
)
def test_each_rule_names_its_field(change, field, words):
    data = {k: v for k, v in {**request(), **change}.items() if v is not None}
    found = errors_of(data)
    assert field in found, found
    assert words in found[field]


def test_not_an_object():
    assert "$" in errors_of(["a list"])


def test_every_error_is_reported_at_once():
    found = errors_of({"run_id": "r", "to": [], "subject": "a\nb", "zzz": 1})
    assert {"step_id", "to", "subject", "zzz", "from", "text"} <= set(found)


def test_domains_allowed_and_blocked():
    policy = Policy(allowed_domains=("example.com",), blocked_domains=("bad.example.com",))
    assert parse(request(to=["a@example.com", "b@sub.example.com"]), policy)
    assert "not in the allowed" in errors_of(request(to=["a@example.org"]), policy)["to[0]"]
    assert "blocked" in errors_of(request(to=["a@bad.example.com"]), policy)["to[0]"]
    assert "blocked" in errors_of(request(to=["a@example.com"], bcc=["z@x.bad.example.com"]), policy)["bcc[0]"]


def test_idna_domains_are_compared_in_ascii():
    policy = Policy(blocked_domains=("xn--bcher-kva.example",))
    assert "blocked" in errors_of(request(to=["a@bücher.example"]), policy)["to[0]"]


def test_size_and_recipient_limits():
    assert "over the limit" in errors_of(request(text="x" * 5000), Policy(max_message_bytes=4096))["text"]
    many = [f"u{i}@example.com" for i in range(3)]
    assert "exceed the limit" in errors_of(request(to=many), Policy(max_recipients=2))["to"]


def test_reserved_sender_is_refused():
    policy = Policy(reserved_senders=("evq@example.org",))
    assert "reserved" in errors_of(request(**{"from": "EVQ@example.org"}), policy)["from"]
    # A rule ending in "@" reserves the local part at every domain (the default notice sender).
    local = Policy(reserved_senders=("evq-notices@",))
    assert "reserved" in errors_of(request(**{"from": "Evq-Notices@anywhere.example"}), local)["from"]
    assert parse(request(**{"from": "evq-notices-not@example.org"}), local)
    # A caller that passes no policy at all (the Python API's default) cannot send as evq either.
    assert "reserved" in errors_of(request(**{"from": "evq-notices@example.org"}), Policy())["from"]


def test_evq_prefix_is_reserved_for_evqs_own_steps():
    errors = errors_of(request(step_id="evq:notice:x", idempotency_key="EVQ:mine"), POLICY)
    assert "reserved" in errors["step_id"] and "reserved" in errors["idempotency_key"]
    assert parse(request(step_id="my-evq:step"), POLICY)


def test_the_recheck_lets_evqs_own_notices_through():
    v = parse(request(**{"from": "evq-notices@example.org"}), replace(POLICY, reserved_senders=()))
    assert check_payload(v.payload, Policy(reserved_senders=("evq-notices@",))) is None


def test_display_names_stay_data():
    v = parse(request(to=['"Doe, John" <john@example.com>']), POLICY)
    assert v.payload["to"] == [{"email": "john@example.com", "name": "Doe, John"}]


def test_check_payload_rechecks_todays_policy():
    v = parse(request(to=["a@example.com"]), POLICY)
    assert check_payload(v.payload, POLICY) is None
    assert "blocked" in check_payload(v.payload, Policy(blocked_domains=("example.com",)))


# The shortcut for plain addresses must give email_validator's own answer, always.
_LOCAL_CHARS = "aZ09._-+!#'~\"@ <>()[]\\,;:é\u00a0"
_DOMAIN_LABELS = [
    "example",
    "EXAMPLE",
    "com",
    "de",
    "bücher",
    "xn--bcher-kva",
    "a" * 63,
    "a" * 64,
    "-x",
    "x-",
    "ex_a",
    "localhost",
    "test",
    "invalid",
    "1",
    "12345",
    "ß",
    "xn--",
    "ﬁ",
    "\u0301a",
    "",
]


@settings(max_examples=1500, deadline=None)
@given(
    local=st.one_of(st.text(alphabet=_LOCAL_CHARS, max_size=70), st.sampled_from(["postmaster", "Abuse", "a" * 65])),
    labels=st.lists(st.sampled_from(_DOMAIN_LABELS), min_size=1, max_size=6),
    extra=st.sampled_from(["", ".", "..", "@x.com", " "]),
)
def test_plain_address_shortcut_agrees_with_email_validator(local, labels, extra):
    assert_agrees_with_email_validator(f"{local}@{'.'.join(labels)}{extra}")


def assert_agrees_with_email_validator(addr: str) -> None:
    from email_validator import EmailNotValidError, validate_email

    from evq.worker.addresses import _checked_address

    try:
        expected = (validate_email(addr, check_deliverability=False).normalized, None)
    except (EmailNotValidError, UnicodeError, ValueError) as exc:
        expected = ("", str(exc))
    assert _checked_address.__wrapped__(addr) == expected


def test_plain_address_shortcut_is_taken():
    from evq.worker import addresses as r

    assert r._plain_address("user7@Example.COM") == "user7@example.com"
    assert r._plain_address("user7@xn--bcher-kva.de") == "user7@bücher.de"
    # Left to email_validator whole: lowercased role names, quoted local parts, bad domains.
    assert r._plain_address("Postmaster@example.com") is None
    assert r._plain_address('"a b"@example.com') is None
    assert r._plain_address("user@localhost") is None
    # A valid local part and a valid domain can still make an address too long.
    long_domain = ".".join(["b" * 63] * 3) + ".com"
    for local in ("a" * 58, "a" * 64):
        addr = f"{local}@{long_domain}"
        assert (r._plain_address(addr) is None) == (len(addr) > 254)
        assert_agrees_with_email_validator(addr)


# -- required provenance (EVQ_REQUIRE_PROVENANCE) ---------------------------------

PROVENANCE = replace(POLICY, require_provenance=("model", "instruction_version"))


def test_required_provenance_refuses_a_request_without_it_naming_each_field() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(request(decision=None), PROVENANCE)
    fields = {e["field"]: e["message"] for e in caught.value.errors}
    assert set(fields) == {"decision.model", "decision.instruction_version"}
    assert "EVQ_REQUIRE_PROVENANCE" in fields["decision.model"]


def test_required_provenance_refuses_an_empty_value_and_keeps_its_own_error_once() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(request(decision={"model": "  ", "instruction_version": 7}), PROVENANCE)
    fields = [e["field"] for e in caught.value.errors]
    # The blank model is missing; the number is already refused as "must be a string", once.
    assert sorted(fields) == ["decision.instruction_version", "decision.model"]


def test_required_provenance_accepts_a_request_that_carries_it() -> None:
    checked = parse(request(decision={"model": "m-1", "instruction_version": "v1"}), PROVENANCE)
    assert checked.decision.model == "m-1" and checked.decision.instruction_version == "v1"
    # Without the setting, a request with no decision at all is still accepted.
    assert parse(request(decision=None), POLICY).decision.model is None


def test_the_send_time_recheck_does_not_ask_a_stored_payload_for_provenance() -> None:
    # A stored payload holds no decision: the adapter's re-check must not refuse every send.
    payload = parse(request(), PROVENANCE).payload
    assert check_payload(payload, PROVENANCE) is None
