"""The SMTP adapter against a real SMTP server on loopback (ops.dev.smtp, aiosmtpd).

One test per classification row of docs/design.md, "Adapters" (RFC 1047), plus the
message-level guarantees: the step's Message-ID on every attempt, Bcc only in the
envelope, display names that cannot add recipients or headers, the policy
re-check, and no password anywhere. Nothing here mocks smtplib.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import json
import re
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from email import policy as email_policy
from email.parser import BytesParser
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from evq.adapters.smtp import SmtpProvider
from evq.adapters.smtp.witness import WitnessTags
from evq.ops.dev.smtp import DevSmtpServer, Fault
from evq.worker.outcomes import Accepted, Outcome, Rejected, Retryable, Unknown
from evq.worker.ports import Provider, SendRequest
from evq.worker.request import Policy, parse
from tests.support import spawn, stop

MESSAGE_ID = "<evq.0123456789abcdef@example.org>"
PASSWORD = "Tr0ub4dor-&-3-horse-battery"  # a known secret to hunt for


# -- helpers -----------------------------------------------------------------


def make_request(*, attempt: int = 1, message_id: str = MESSAGE_ID, **fields: Any) -> SendRequest:
    """A request whose payload went through the real validator, as the core stores it."""
    data: dict[str, Any] = {
        "run_id": "run-1",
        "step_id": "notify",
        "from": "Evq Sender <sender@example.org>",
        "to": ["ok@example.com"],
        "subject": "Hello",
        "text": "Hi there.\n.a line that starts with a dot\n",
    }
    data.update(fields)
    valid = parse(data)
    return SendRequest(
        step_id=1,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=message_id,
        attempt=attempt,
        payload=valid.payload,
    )


def send(server_or_port: DevSmtpServer | int, *requests: SendRequest, **options: Any) -> list[Outcome]:
    """Send each request through a fresh provider, in order; close it afterwards."""
    port = server_or_port if isinstance(server_or_port, int) else server_or_port.port
    options.setdefault("timeout", 5.0)

    async def run() -> list[Outcome]:
        provider = SmtpProvider(host="127.0.0.1", port=port, **options)
        try:
            return [await provider.send(r) for r in requests]
        finally:
            await provider.close()

    return asyncio.run(run())


def send_one(server: DevSmtpServer | int, request: SendRequest | None = None, **options: Any) -> Outcome:
    return send(server, request or make_request(), **options)[0]


def headers_of(message: dict[str, Any]) -> Any:
    return BytesParser(policy=email_policy.default).parsebytes(message["data"])


def header_block(message: dict[str, Any]) -> bytes:
    return message["data"].split(b"\r\n\r\n", 1)[0]


@pytest.fixture
def server() -> Iterator[DevSmtpServer]:
    with DevSmtpServer(slow_seconds=2.0) as s:
        yield s


def test_provider_satisfies_the_port() -> None:
    provider = SmtpProvider(host="127.0.0.1", port=25)
    assert isinstance(provider, Provider)
    assert provider.name == "smtp" and provider.dedupe_window is None
    asyncio.run(provider.close())


# -- classification ----------------------------------------------------------


def test_accepted_carries_the_queue_id(server: DevSmtpServer) -> None:
    outcome = send_one(server)

    assert isinstance(outcome, Accepted)
    [message] = server.messages
    assert outcome.provider_message_id == message["queue_id"]
    # Visibly a test id, never the shape of a real MTA's (Postfix: upper-case hex).
    assert re.fullmatch(r"test_[0-9a-f]{24}", outcome.provider_message_id)
    assert outcome.response["phase"] == "final" and outcome.response["code"] == 250
    assert outcome.response["error_class"] is None and outcome.response["refused"] == {}
    assert message["message_id"] == MESSAGE_ID
    # Dot-stuffing survived the trip: the body line starting with "." arrived intact.
    assert headers_of(message).get_content().splitlines()[1] == ".a line that starts with a dot"


def test_every_recipient_refused_is_rejected(server: DevSmtpServer) -> None:
    outcome = send_one(server, make_request(to=["reject@example.com"]))

    assert isinstance(outcome, Rejected) and not outcome.before_send
    assert outcome.response["phase"] == "rcpt" and outcome.response["code"] == 550
    assert set(outcome.response["refused"]) == {"reject@example.com"}
    assert server.messages == []


def test_the_journal_recipient_is_the_steps_tagged_subaddress_and_no_evidence_names_it(server: DevSmtpServer) -> None:
    # Each step's copy goes to its own subaddress, journal+<tag> (adapters/smtp/witness.py),
    # also when the journal address is a real recipient: a RCPT of its own, never in a header.
    tags = WitnessTags(b"p" * 32)
    tagged = tags.address("ok@example.com", MESSAGE_ID)
    accepted = send_one(server, make_request(to=["ok@example.com"]), journal="ok@example.com", witness_tags=tags)

    assert isinstance(accepted, Accepted), accepted
    assert accepted.response["journal"] == {"accepted": True, "code": 250, "reply": "2.1.5 Ok"}
    [message] = server.messages
    assert message["rcpt_tos"] == ["ok@example.com", tagged] and tagged.encode() not in message["data"]

    # Refused (the server echoes the address it refuses): no copy exists, and the evidence, which
    # every key reads, says "[journal]" for the address; never the tag, which would forge the proof.
    refused = send_one(
        server,
        make_request(to=["Reject@example.com", "ok@example.com"]),
        journal="reject@example.com",
        witness_tags=tags,
    )
    assert isinstance(refused, Accepted), refused
    assert set(refused.response["refused"]) == {"Reject@example.com"}
    assert refused.response["journal"] == {
        "accepted": False,
        "code": 550,
        "reply": "5.1.1 <[journal]>: recipient rejected (fault: reject)",
    }
    assert tags.tag(MESSAGE_ID) not in json.dumps(refused.response)


def test_a_journal_needs_the_installations_witness_tags() -> None:
    with pytest.raises(ValueError, match="witness tags"):
        SmtpProvider(host="127.0.0.1", port=25, journal="journal@example.org")


def test_partial_refusal_sends_to_the_accepted_and_lists_the_refused(server: DevSmtpServer) -> None:
    outcome = send_one(server, make_request(to=["ok@example.com", "reject+x@example.com"]))

    assert isinstance(outcome, Accepted)
    assert outcome.response["refused"] == {
        "reject+x@example.com": {
            "code": 550,
            "reply": "5.1.1 <reject+x@example.com>: recipient rejected (fault: reject)",
        }
    }
    [message] = server.messages
    assert message["rcpt_tos"] == ["ok@example.com"]


def test_temporary_rcpt_failure_resets_and_is_retryable(server: DevSmtpServer) -> None:
    request = make_request(to=["ok@example.com", "tempfail@example.com"])
    outcome = send_one(server, request)

    assert isinstance(outcome, Retryable)
    assert outcome.response["phase"] == "rcpt" and outcome.response["code"] == 451
    assert "tempfail@example.com" in outcome.response["refused"]
    # RSET: the recipient that was accepted got nothing, so a retry cannot double it.
    assert server.messages == []


def test_queued_tempfail_fails_one_connection_and_the_retry_delivers_once(server: DevSmtpServer) -> None:
    server.queue_fault("tempfail")
    request = make_request(to=["ok@example.com", "other@example.com"])
    first, second = send(server, request, make_request(attempt=2, to=["ok@example.com", "other@example.com"]))

    assert isinstance(first, Retryable) and isinstance(second, Accepted)
    [message] = server.messages
    assert message["rcpt_tos"] == ["ok@example.com", "other@example.com"]


@pytest.mark.parametrize(
    ("address", "kind", "code"),
    [("tempfail-data@example.com", Retryable, 451), ("reject-data@example.com", Rejected, 554)],
)
def test_answer_after_the_final_dot_is_definite(server: DevSmtpServer, address: str, kind: type, code: int) -> None:
    outcome = send_one(server, make_request(to=[address]))

    assert isinstance(outcome, kind)
    assert outcome.response["phase"] == "final" and outcome.response["code"] == code
    assert server.messages == []


def test_lost_reply_after_the_final_dot_is_unknown(server: DevSmtpServer) -> None:
    outcome = send_one(server, make_request(to=["lose-reply@example.com"]))

    assert isinstance(outcome, Unknown)
    assert outcome.response["phase"] == "final" and outcome.response["code"] is None
    assert outcome.response["error_class"] is not None
    # The server did take it: exactly the case a blind retry would duplicate.
    assert server.by_message_id() == {MESSAGE_ID: 1}


def test_connection_refused_is_retryable_and_the_retry_delivers(server: DevSmtpServer) -> None:
    server.stop()
    outcome = send_one(server)

    assert isinstance(outcome, Retryable)
    assert outcome.response["phase"] == "connect"
    assert outcome.response["error_class"] == "ConnectionRefusedError"
    assert outcome.fault == "connection_refused"  # the provider is down: it opens the circuit (worker/circuit.py)
    server.start()  # back on the same port
    assert isinstance(send_one(server, make_request(attempt=2)), Accepted)
    assert server.by_message_id() == {MESSAGE_ID: 1}


def test_timeout_after_the_final_dot_is_unknown(server: DevSmtpServer) -> None:
    outcome = send_one(server, make_request(to=["slow-2@example.com"]), timeout=0.3)

    assert isinstance(outcome, Unknown)
    assert outcome.response["phase"] == "final" and outcome.response["error_class"] == "TimeoutError"
    assert server.by_message_id() == {MESSAGE_ID: 1}


def test_timeout_before_data_is_retryable(server: DevSmtpServer) -> None:
    server.fault = Fault("slow-ehlo", seconds=2.0)
    outcome = send_one(server, timeout=0.3)

    assert isinstance(outcome, Retryable)
    assert outcome.response["phase"] == "ehlo" and outcome.response["error_class"] == "TimeoutError"
    assert "timed out at ehlo" in outcome.reason
    assert server.messages == []


def test_held_reply_is_accepted_once_released(server: DevSmtpServer) -> None:
    server.queue_fault("hold")

    async def run() -> Outcome:
        provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0)
        try:
            pending = asyncio.create_task(provider.send(make_request()))
            await asyncio.to_thread(server.wait_held, 1)
            assert not pending.done()
            server.release()
            return await pending
        finally:
            await provider.close()

    assert isinstance(asyncio.run(run()), Accepted)
    assert server.held == 0


def test_concurrent_sends_share_the_pool(server: DevSmtpServer) -> None:
    requests = [make_request(message_id=f"<evq.{i}@example.org>") for i in range(24)]

    async def run() -> list[Outcome]:
        provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0, max_workers=4)
        try:
            return await asyncio.gather(*(provider.send(r) for r in requests))
        finally:
            await provider.close()

    outcomes = asyncio.run(run())
    assert all(isinstance(o, Accepted) for o in outcomes)
    assert len({o.provider_message_id for o in outcomes}) == 24
    assert sorted(server.by_message_id()) == sorted(r.message_id for r in requests)


# -- the message -------------------------------------------------------------


def test_every_attempt_carries_the_steps_message_id_and_never_its_key(server: DevSmtpServer) -> None:
    server.queue_fault("lose-reply")
    first, second = send(server, make_request(attempt=1), make_request(attempt=2))

    assert isinstance(first, Unknown) and isinstance(second, Accepted)
    assert server.by_message_id() == {MESSAGE_ID: 2}
    for message in server.messages:
        parsed = headers_of(message)
        assert parsed.get_all("Message-ID") == [MESSAGE_ID]
        # The key is run_id:step_id, the caller's internal ids: recipients never see it.
        assert b"run-1:notify" not in message["data"] and not any(k.lower().startswith("x-evq") for k in parsed.keys())


def test_message_headers_and_alternative_body(server: DevSmtpServer) -> None:
    request = make_request(
        to=["Ada Lovelace <ada@example.com>"],
        cc=["cc@example.com"],
        reply_to=["replies@example.org"],
        subject="Quarterly report — draft",
        html="<p>Hi <b>there</b></p>",
        headers={"In-Reply-To": "<earlier@example.org>"},
    )
    assert isinstance(send_one(server, request), Accepted)

    parsed = headers_of(server.messages[0])
    assert str(parsed["From"]) == "Evq Sender <sender@example.org>"
    assert str(parsed["To"]) == "Ada Lovelace <ada@example.com>"
    assert str(parsed["Cc"]) == "cc@example.com"
    assert str(parsed["Reply-To"]) == "replies@example.org"
    assert str(parsed["Subject"]) == "Quarterly report — draft"
    assert parsed["MIME-Version"] == "1.0" and parsed["Date"].datetime is not None
    assert parsed["In-Reply-To"] == "<earlier@example.org>"
    assert parsed.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]


def test_bcc_is_only_in_the_envelope(server: DevSmtpServer) -> None:
    request = make_request(to=["ok@example.com"], bcc=["Hidden Person <hidden@example.net>"])
    assert isinstance(send_one(server, request), Accepted)

    [message] = server.messages
    assert message["rcpt_tos"] == ["ok@example.com", "hidden@example.net"]
    assert "Bcc" not in headers_of(message)
    assert b"hidden" not in header_block(message).lower()


def test_display_names_cannot_add_recipients_or_headers(server: DevSmtpServer) -> None:
    hostile = 'Mallory, <evil@example.net>, "x" <evil2@example.net> Bcc: evil3@example.net'
    request = make_request(
        **{"from": {"email": "sender@example.org", "name": hostile}},
        to=[{"email": "ok@example.com", "name": hostile}],
        cc=[{"email": "cc@example.com", "name": "<evil4@example.net>;,"}],
    )
    assert isinstance(send_one(server, request), Accepted)

    [message] = server.messages
    assert message["rcpt_tos"] == ["ok@example.com", "cc@example.com"]
    parsed = headers_of(message)
    [to] = parsed["To"].addresses
    assert (to.addr_spec, to.display_name) == ("ok@example.com", hostile)
    assert [a.addr_spec for a in parsed["From"].addresses] == ["sender@example.org"]
    assert [a.addr_spec for a in parsed["Cc"].addresses] == ["cc@example.com"]
    assert "Bcc" not in parsed


def test_raw_cr_lf_in_a_stored_name_is_refused_before_sending(server: DevSmtpServer) -> None:
    # A row not written by the validator: the adapter's re-check still refuses it.
    request = make_request()
    payload = dict(request.payload, to=[{"email": "ok@example.com", "name": "A\r\nBcc: evil@example.net"}])
    outcome = send_one(server, SendRequest(**{**_fields(request), "payload": payload}))

    assert isinstance(outcome, Rejected) and outcome.before_send
    assert outcome.response["phase"] == "policy"
    assert server.messages == []


@pytest.mark.parametrize("where", ["name", "subject"])
def test_encoded_word_that_decodes_to_cr_lf_is_refused(server: DevSmtpServer, where: str) -> None:
    # Passes the validator (no raw control characters), but Python's email package
    # would decode it and write a real "Bcc:" header (CVE-2024-6923).
    sneaky = "=?utf-8?q?x=0D=0ABcc:_evil@example.net?="
    request = make_request()
    patched = dict(request.payload)  # as if written by something other than the validator
    if where == "subject":
        patched["subject"] = sneaky
    else:
        patched["to"] = [{"email": "ok@example.com", "name": sneaky}]
    outcome = send_one(server, replace(request, payload=patched))

    # Refused before connecting: by today's validator on the re-check ("policy"), and
    # were that ever relaxed, by the rendering check ("build").
    assert isinstance(outcome, Rejected) and outcome.before_send
    assert outcome.response["phase"] in ("policy", "build")
    assert server.messages == []


def test_policy_recheck_refuses_before_connecting() -> None:
    # Port 9 on loopback has nobody listening: had the adapter connected, the
    # outcome would be Retryable, not a policy refusal.
    outcome = send_one(
        9, make_request(to=["someone@blocked.example.com"]), policy=Policy(blocked_domains=("blocked.example.com",))
    )

    assert isinstance(outcome, Rejected) and outcome.before_send
    assert "blocked" in outcome.reason
    assert outcome.response["phase"] == "policy"


def test_non_ascii_local_part_uses_smtputf8_when_offered(server: DevSmtpServer) -> None:
    outcome = send_one(server, make_request(to=["José <josé@example.com>"]))

    assert isinstance(outcome, Accepted)
    assert server.messages[0]["rcpt_tos"] == ["josé@example.com"]


def test_non_ascii_local_part_without_smtputf8_is_refused_before_sending() -> None:
    with DevSmtpServer(smtputf8=False) as plain:
        outcome = send_one(plain, make_request(to=["josé@example.com"]))
        assert plain.messages == []

    assert isinstance(outcome, Rejected) and outcome.before_send
    assert "SMTPUTF8" in outcome.reason


# -- authentication and TLS --------------------------------------------------


def test_the_password_never_appears_in_outcomes_or_logs(capfd: pytest.CaptureFixture[str]) -> None:
    forms = [
        PASSWORD,
        base64.b64encode(PASSWORD.encode()).decode(),
        base64.b64encode(b"\0evq\0" + PASSWORD.encode()).decode(),
    ]
    with DevSmtpServer(auth=("evq", PASSWORD)) as authed, structlog.testing.capture_logs() as logs:
        # The loopback test server has no TLS: plain AUTH must be allowed explicitly.
        good = send_one(authed, username="evq", password=PASSWORD, allow_plain_auth=True)
        bad = send_one(authed, username="evq", password=PASSWORD + "-wrong", allow_plain_auth=True)
        anonymous = send_one(authed)

    assert isinstance(good, Accepted)
    assert isinstance(bad, Retryable) and bad.response["phase"] == "auth" and bad.response["code"] == 535
    assert isinstance(anonymous, Retryable) and anonymous.response["code"] == 530
    # Faults of our settings, not of the message: each opens the provider's circuit.
    assert bad.fault == "auth_failed" and anonymous.fault == "auth_failed" and good.kind == "accepted"
    assert any(e["event"] == "smtp_config_failure" and e["log_level"] == "error" for e in logs)
    out, err = capfd.readouterr()
    provider = SmtpProvider(host="127.0.0.1", port=authed.port, username="evq", password=PASSWORD)
    evidence = repr([good, bad, anonymous]) + repr(logs) + out + err + repr(provider)
    asyncio.run(provider.close())
    for form in forms:
        assert form not in evidence


def _certificate(directory: Any) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, written as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "evq test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cert, key = _certificate(tmp_path_factory.mktemp("tls"))
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    return server_side, ssl.create_default_context(cafile=cert)


def test_starttls_then_auth(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_side, client_side = tls
    with DevSmtpServer(tls_context=server_side, auth=("evq", PASSWORD)) as secure:
        outcome = send_one(secure, tls="starttls", ssl_context=client_side, username="evq", password=PASSWORD)
        assert len(secure.messages) == 1

    assert isinstance(outcome, Accepted)


def test_implicit_tls(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_side, client_side = tls
    with DevSmtpServer(ssl_context=server_side) as secure:
        outcome = send_one(secure, tls="ssl", ssl_context=client_side)

    assert isinstance(outcome, Accepted)


def test_starttls_missing_never_falls_back_to_plain_text(server: DevSmtpServer) -> None:
    outcome = send_one(server, tls="starttls")

    assert isinstance(outcome, Retryable) and outcome.response["phase"] == "starttls"
    assert outcome.fault == "tls_failed"
    assert server.messages == []


def test_untrusted_certificate_is_retryable(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_side, _ = tls
    with DevSmtpServer(tls_context=server_side) as secure:
        outcome = send_one(secure, tls="starttls")  # the system trust store does not know it
        assert secure.messages == []

    assert isinstance(outcome, Retryable)
    assert outcome.response["phase"] == "starttls"
    assert outcome.response["error_class"] == "SSLCertVerificationError"
    assert outcome.fault == "tls_failed"


def _fields(request: SendRequest) -> dict[str, Any]:
    return {f: getattr(request, f) for f in SendRequest.__dataclass_fields__}


def test_standalone_sink_prints_each_message_id() -> None:
    proc = spawn(
        [sys.executable, "-m", "evq.ops.dev.smtp", "--host", "127.0.0.1", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        port = int(banner.split("127.0.0.1:", 1)[1].split()[0])
        assert isinstance(send_one(port), Accepted)
        assert MESSAGE_ID in proc.stderr.readline()
    finally:
        code = stop(proc, signal.SIGINT, grace=10)
    assert code == 0  # Ctrl-C is its documented way to stop


# -- more recipients than one transaction takes (452 4.5.3) -------------------


def test_a_lost_reply_in_a_later_transaction_is_unknown() -> None:
    """The first transaction was accepted; the second's reply is lost after its final ".":
    those recipients may have it too, so the step is unknown (never retried, never rejected)."""
    with DevSmtpServer(max_recipients=1) as limited:
        outcome = send_one(limited, make_request(to=["ok@example.com", "lose-reply@example.com"]))
        assert [m["rcpt_tos"] for m in limited.messages] == [["ok@example.com"], ["lose-reply@example.com"]]

    assert isinstance(outcome, Unknown), outcome
    assert "accepted the message for 1 recipient" in outcome.reason
    assert [t["recipients"] for t in outcome.response["transactions"]] == [1]


def test_a_temporary_refusal_in_a_later_transaction_leaves_the_send_accepted() -> None:
    """Once a transaction was accepted nothing may be retried (its recipients would get it
    twice): a recipient refused, even temporarily, in a later one is recorded as refused."""
    with DevSmtpServer(max_recipients=1) as limited:
        outcome = send_one(limited, make_request(to=["ok@example.com", "tempfail@example.com"]))
        assert [m["rcpt_tos"] for m in limited.messages] == [["ok@example.com"]]

    assert isinstance(outcome, Accepted), outcome
    assert outcome.response["refused"]["tempfail@example.com"]["code"] == 451
    assert outcome.response["transactions"][0]["deferred_by"]["code"] == 452
