"""Rendering a normalized payload as the bytes the SMTP adapter sends (adapters/smtp/message.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from email import policy as email_policy
from email.message import EmailMessage
from email.parser import BytesParser, Parser
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evq.adapters.smtp import BuildError, Envelope, address_literal, build_message, queue_id
from evq.worker.ports import SendRequest
from evq.worker.request import parse

MESSAGE_ID = "<evq.feedface@example.org>"
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def payload(**fields: Any) -> dict[str, Any]:
    data = {
        "run_id": "r",
        "step_id": "s",
        "from": "Sender <sender@example.org>",
        "to": ["ok@example.com"],
        "subject": "Hello",
        "text": "Hi.",
    }
    data.update(fields)
    return parse(data).payload


def build(raw: dict[str, Any] | None = None, *, message_id: str = MESSAGE_ID, key: str = "r:s") -> Envelope:
    request = SendRequest(
        step_id=7,
        run_id="r",
        idempotency_key=key,
        message_id=message_id,
        attempt=1,
        payload=raw if raw is not None else payload(),
    )
    return build_message(request, now=NOW)


def parsed(envelope: Envelope) -> EmailMessage:
    if envelope.smtputf8:
        return Parser(policy=email_policy.default).parsestr(envelope.data.decode("utf-8"))  # type: ignore[return-value]
    return BytesParser(policy=email_policy.default).parsebytes(envelope.data)  # type: ignore[return-value]


def test_headers_in_order_and_exactly_ours() -> None:
    envelope = build(payload(cc=["cc@example.com"], reply_to=["r@example.org"], headers={"References": "<a@b>"}))
    msg = parsed(envelope)

    assert list(msg.keys()) == [
        "From",
        "To",
        "Cc",
        "Reply-To",
        "Subject",
        "Date",
        "Message-ID",
        "References",
        "Content-Type",
        "Content-Transfer-Encoding",
        "MIME-Version",
    ]
    assert msg["Message-ID"] == MESSAGE_ID
    assert msg["Date"].datetime == NOW
    # The idempotency key ("r:s", the caller's run and step ids) is never in the message.
    assert b"r:s" not in envelope.data
    assert envelope.sender == "sender@example.org"
    assert envelope.data.endswith(b"\r\n") and b"\n" not in envelope.data.replace(b"\r\n", b"")


@pytest.mark.parametrize(
    ("text", "html", "content_type", "parts"),
    [
        ("plain", None, "text/plain", []),
        (None, "<p>html</p>", "text/html", []),
        ("plain", "<p>html</p>", "multipart/alternative", ["text/plain", "text/html"]),
    ],
)
def test_body_shapes(text: str | None, html: str | None, content_type: str, parts: list[str]) -> None:
    msg = parsed(build(payload(text=text, html=html)))

    assert msg.get_content_type() == content_type
    assert [p.get_content_type() for p in msg.iter_parts()] == parts


def test_non_ascii_body_needs_no_8bitmime() -> None:
    envelope = build(payload(text="Grüße — " * 40, html="<p>ünïcode</p>"))
    assert envelope.data.isascii()
    assert parsed(envelope).get_body(("plain",)).get_content().startswith("Grüße")


def test_bcc_only_in_the_envelope_and_recipients_deduplicated() -> None:
    envelope = build(
        payload(to=["ok@example.com"], cc=["OK@example.com", "cc@example.com"], bcc=["hidden@example.net"])
    )

    assert envelope.recipients == ("ok@example.com", "cc@example.com", "hidden@example.net")
    assert "Bcc" not in parsed(envelope)
    assert b"hidden" not in envelope.data


@pytest.mark.parametrize(
    "name",
    [
        "Doe, John",
        "Mallory <evil@example.net>",
        'a "quoted" \\ name, <x@y> Bcc: z@example.net',
        "Chloé Dürer",
        "Jörg " * 40,
        "x" * 200,
        "To: someone@example.net",
    ],
)
def test_display_names_round_trip_without_adding_addresses(name: str) -> None:
    raw = payload(to=[{"email": "ok@example.com", "name": name}], cc=["cc@example.com"])
    msg = parsed(build(raw))

    [to] = msg["To"].addresses
    assert to.addr_spec == "ok@example.com"
    # Python's parser shows the fold between two encoded words in a display name as a
    # space (RFC 2047 says to drop it), so compare the words, not the spacing.
    assert to.display_name.split() == name.split()
    assert [a.addr_spec for a in msg["Cc"].addresses] == ["cc@example.com"]
    assert max(len(line) for line in build(raw).data.split(b"\r\n")) <= 998


def test_raw_control_characters_in_a_stored_name_become_spaces() -> None:
    raw = payload()
    raw["to"] = [{"email": "ok@example.com", "name": "A\r\nBcc: evil@example.net\x00"}]
    msg = parsed(build(raw))

    assert "Bcc" not in msg
    [to] = msg["To"].addresses
    assert to.addr_spec == "ok@example.com" and "\n" not in to.display_name


@pytest.mark.parametrize("where", ["name", "subject", "header"])
def test_encoded_words_that_decode_to_a_line_break_are_refused(where: str) -> None:
    # The validator refuses these at enqueue; a row written by anything else must
    # still not render them, so the payload is patched after validation here.
    sneaky = "=?utf-8?q?x=0D=0ABcc:_evil@example.net?="
    raw = payload()
    if where == "name":
        raw["to"] = [{"email": "ok@example.com", "name": sneaky}]
    elif where == "subject":
        raw["subject"] = sneaky
    else:
        raw["headers"] = {"Keywords": sneaky}
    with pytest.raises(BuildError):
        build(raw)


@pytest.mark.parametrize("subject", ["a,b;c " * 150, "x" * 990, "héllo wörld " * 80, "two  spaces", "Re: [x] ok"])
def test_subjects_round_trip_within_the_line_limit(subject: str) -> None:
    envelope = build(payload(subject=subject))

    assert str(parsed(envelope)["Subject"]) == subject.strip()
    assert max(len(line) for line in envelope.data.split(b"\r\n")) <= 998


def test_non_ascii_local_part_needs_smtputf8_but_a_non_ascii_domain_does_not() -> None:
    utf8 = build(payload(to=["José <josé@example.com>"]))
    idn = build(payload(to=["jose@exämple.com"]))

    assert utf8.smtputf8 and utf8.recipients == ("josé@example.com",)
    assert parsed(utf8)["To"].addresses[0].username == "josé"
    assert not idn.smtputf8 and idn.recipients == ("jose@xn--exmple-cua.com",)
    assert idn.data.isascii()


@pytest.mark.parametrize("message_id", ["", "no-brackets@example.org", "<two words@example.org>", "<x@y>\r\nBcc: z"])
def test_a_malformed_step_message_id_is_refused(message_id: str) -> None:
    with pytest.raises(BuildError):
        build(message_id=message_id)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("2.0.0 Ok: queued as 4Xb9Qh0YzKz3", "4Xb9Qh0YzKz3"),
        ("OK id=1rAbCd-0001xY-2Z", "1rAbCd-0001xY-2Z"),
        ("2.0.0 x9S1fG3k012345 Message accepted for delivery", "x9S1fG3k012345"),
        (
            "Ok 0100018c1b2c3d4e-5f6a7b8c-1111-2222-3333-444455556666-000000",
            "0100018c1b2c3d4e-5f6a7b8c-1111-2222-3333-444455556666-000000",
        ),
        ("mx.example.net\n2.0.0 Ok: queued as ABC123", "ABC123"),
        ("OK", None),
        ("2.0.0 Ok", None),
    ],
)
def test_queue_id_from_common_replies(reply: str, expected: str | None) -> None:
    assert queue_id(reply) == expected


_names = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), max_size=60)


@settings(max_examples=300, deadline=None, database=None)
@given(name=_names, subject=_names.filter(lambda s: s.strip()))
def test_no_name_or_subject_changes_who_receives_it(name: str, subject: str) -> None:
    raw = payload(to=[{"email": "ok@example.com", "name": name or None}], subject=subject)
    try:
        envelope = build(raw)
    except BuildError:
        return  # refused before sending is always safe
    msg = parsed(envelope)
    assert envelope.recipients == ("ok@example.com",)
    assert [a.addr_spec for a in msg["To"].addresses] == ["ok@example.com"]
    assert len(msg.keys()) == len(set(k.lower() for k in msg.keys()))


def test_address_literals_for_the_default_helo():
    assert address_literal(("10.0.0.5", 40123)) == "[10.0.0.5]"
    assert address_literal(("2001:db8::1", 40123, 0, 0)) == "[IPv6:2001:db8::1]"
    assert address_literal(("fe80::1%eth0", 40123, 0, 2)) == "[IPv6:fe80::1]"
