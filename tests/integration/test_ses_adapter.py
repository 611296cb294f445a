"""The SES adapter against moto in server mode (real HTTP on loopback), and against real
peers for what moto cannot answer (tests/sesserver.py).

One test per classification row of adapters/ses/provider.py, each made to happen by a
server: moto accepting (its MessageId kept, the tags and our Message-ID as moto received
them) and rejecting an unverified sender for real; SES's documented error answers for
throttling, a suspended account and the rest; a lost reply after moto took the message; a
closed port; a peer that never answers; the lease fence; no hidden botocore retry; and no
credential anywhere.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from email import message_from_string
from typing import Any

import pytest
import structlog

from evq.adapters.ses import SesProvider, destination
from evq.adapters.smtp.message import build_message
from evq.worker.delivery import DELIVERY_TYPES, KEY_TAG, key_tag
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.ports import Lookup, Provider, ProviderProfile, SendRequest, profile_of
from evq.worker.request import Policy, parse
from tests.sesserver import ACCESS_KEY, REGION, SECRET_KEY, SENDER, LostReplyProxy, MotoSes, SesErrorPeer

CONFIGURATION_SET = "evq-events"


def make_request(*, step_id: str = "hello", send_by: float | None = None, deadline: float | None = None, **fields: Any):
    data: dict[str, Any] = {
        "run_id": "run-1",
        "step_id": step_id,
        "from": f"Evq Sender <{SENDER}>",
        "to": ["ok@example.com"],
        "subject": "Hello",
        "text": "Hi there.",
        **fields,
    }
    valid = parse(data, Policy(reserved_senders=()))
    return SendRequest(
        step_id=7,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=f"<evq.{step_id}@example.org>",
        attempt=1,
        payload=valid.payload,
        send_by=send_by,
        deadline=deadline,
    )


def ses(url: str, **kw: Any) -> SesProvider:
    return SesProvider(
        region=REGION,
        endpoint_url=url,
        configuration_set=kw.pop("configuration_set", CONFIGURATION_SET),
        timeout=kw.pop("timeout", 2.0),
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        **kw,
    )


@pytest.fixture
def moto() -> Iterator[MotoSes]:
    with MotoSes() as server:
        client = server.client()
        client.create_configuration_set(ConfigurationSetName=CONFIGURATION_SET)
        client.close()
        yield server


@pytest.fixture
async def provider(moto: MotoSes) -> AsyncIterator[SesProvider]:
    p = ses(moto.url)
    try:
        yield p
    finally:
        await p.close()


async def answer(url: str, request: SendRequest | None = None, **kw: Any):
    p = ses(url, **kw)
    try:
        return await p.send(request or make_request())
    finally:
        await p.close()


def test_the_adapter_satisfies_the_port_and_declares_what_ses_can_do(moto) -> None:
    p = ses(moto.url)
    assert isinstance(p, Provider) and not isinstance(p, Lookup) and p.dedupe_window is None
    # Alone it knows of nothing that settles a lost answer; the composition root passes what the
    # settings give (tests/unit/test_provider_profiles.py: events with a configuration set and
    # a verified SNS webhook).
    assert profile_of(p) == ProviderProfile(dedupe_window=None, lookup_by=(), webhook_events=())
    hooked = ProviderProfile(webhook_events=DELIVERY_TYPES)
    assert profile_of(ses(moto.url, profile=hooked)) == hooked
    assert SECRET_KEY not in repr(p)


# -- moto: accepted, and what it received -----------------------------------------------


async def test_a_send_is_accepted_with_the_message_id_ses_gave(provider, moto) -> None:
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Accepted), outcome
    [message] = moto.messages()
    assert outcome.provider_message_id == message["id"] and message["source"] == SENDER
    assert outcome.response["code"] == 200 and outcome.response["sent"] is True


async def test_the_key_tag_and_the_configuration_set_reach_ses_and_the_key_does_not(provider, moto) -> None:
    request = make_request(step_id="tagged")
    assert isinstance(await provider.send(request), Accepted)
    [sent] = moto.sends()
    assert sent["EmailTags"] == [{"Name": KEY_TAG, "Value": key_tag("run-1:tagged", request.message_id)}]
    assert sent["ConfigurationSetName"] == CONFIGURATION_SET
    # The caller's run and step ids are nobody's business at SES or in the recipients' copy.
    raw = moto.messages()[0]["raw_data"]
    assert "run-1:tagged" not in json.dumps(sent) and "run-1" not in raw


async def test_the_raw_message_carries_our_message_id_and_the_bcc_only_in_the_envelope(provider, moto) -> None:
    request = make_request(step_id="raw", cc=["copy@example.com"], bcc=["hidden@example.com"])
    assert isinstance(await provider.send(request), Accepted)
    [message] = moto.messages()
    parsed = message_from_string(message["raw_data"])
    assert parsed["Message-ID"] == "<evq.raw@example.org>"
    assert parsed["To"] == "ok@example.com" and parsed["Cc"] == "copy@example.com" and "Bcc" not in parsed
    assert "hidden@example.com" not in message["raw_data"]
    [sent] = moto.sends()
    assert sent["Destination"] == {
        "ToAddresses": ["ok@example.com"],
        "CcAddresses": ["copy@example.com"],
        "BccAddresses": ["hidden@example.com"],
    }
    assert "hidden@example.com" in message["destinations"]


def test_destination_splits_the_envelope_as_the_rendered_headers_say() -> None:
    request = make_request(
        to=["A@Example.com", "b@example.com"], cc=["b@example.com", "c@example.com"], bcc=["d@x.org"]
    )
    envelope = build_message(request)
    assert destination(envelope) == {
        "ToAddresses": ["A@example.com", "b@example.com"],
        "CcAddresses": ["c@example.com"],
        "BccAddresses": ["d@x.org"],
    }


async def test_an_unverified_sender_is_rejected_by_ses(moto) -> None:
    outcome = await answer(moto.url, make_request(**{"from": "stranger@example.net"}))
    assert isinstance(outcome, Rejected) and not outcome.before_send, outcome
    assert outcome.response["error_name"] == "MessageRejected" and outcome.response["code"] == 400
    assert moto.messages() == []


# -- SES's documented error answers -----------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (429, "TooManyRequestsException"),
        (400, "ThrottlingException"),
        (400, "Throttling"),
        (400, "LimitExceededException"),
    ],
)
async def test_throttling_is_retryable_and_throttled_and_sent_once(status, error_type) -> None:
    with SesErrorPeer([(status, error_type, "Maximum sending rate exceeded.")]) as peer:
        outcome = await answer(peer.url)
        assert isinstance(outcome, Retryable) and outcome.throttled and not outcome.misconfigured, outcome
        assert outcome.response["error_name"] == error_type
        # botocore would retry a throttled call by itself; evq decides retries.
        assert len(peer.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "MessageRejected"),
        (400, "BadRequestException"),
        (400, "MailFromDomainNotVerifiedException"),
    ],
)
async def test_a_refusal_of_the_message_is_rejected(status, error_type) -> None:
    with SesErrorPeer([(status, error_type, "no")]) as peer:
        outcome = await answer(peer.url)
        assert isinstance(outcome, Rejected) and not outcome.before_send, outcome
        assert outcome.response["error_name"] == error_type and len(peer.requests) == 1


@pytest.mark.parametrize(
    ("status", "error_type", "fault"),
    [
        (400, "AccountSuspendedException", "forbidden"),
        (400, "SendingPausedException", "forbidden"),
        (403, "AccessDeniedException", "forbidden"),
        (404, "NotFoundException", "forbidden"),
        (403, "UnrecognizedClientException", "auth_failed"),
        (403, "InvalidSignatureException", "auth_failed"),
    ],
)
async def test_an_account_or_credential_fault_is_misconfigured_and_opens_the_circuit(status, error_type, fault) -> None:
    with SesErrorPeer([(status, error_type, "not for you")]) as peer:
        with structlog.testing.capture_logs() as logs:
            outcome = await answer(peer.url)
        assert isinstance(outcome, Retryable) and outcome.misconfigured and outcome.fault == fault, outcome
        assert not outcome.throttled and len(peer.requests) == 1
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["ses_config_failure"]


@pytest.mark.parametrize(
    ("status", "error_type", "kind"),
    [
        (502, None, Unknown),  # a gateway's page: SES behind it may have taken the message
        (500, "InternalFailure", Unknown),
        (400, "SomethingEvqHasNeverSeen", Unknown),  # unclassified: fail closed
        (503, "ServiceUnavailable", Retryable),  # SES's own word that it did not take it
    ],
)
async def test_server_errors_are_unknown_unless_ses_says_it_did_not_take_it(status, error_type, kind) -> None:
    with SesErrorPeer([(status, error_type, "oops")]) as peer:
        outcome = await answer(peer.url)
        assert type(outcome) is kind, outcome
        assert outcome.response["sent"] is True and len(peer.requests) == 1


# -- the transport: before and after the request was written ----------------------------


async def test_a_lost_reply_after_ses_took_the_message_is_unknown(moto) -> None:
    with LostReplyProxy(moto.host, moto.port) as proxy:
        outcome = await answer(proxy.url)
    assert isinstance(outcome, Unknown), outcome
    assert outcome.response["sent"] is True and outcome.response["phase"] == "answer"
    # moto had the message and answered 200 with its id; the client never saw it.
    assert proxy.forwarded == 1 and b" 200 " in proxy.answers[0]
    assert len(moto.messages()) == 1


async def test_a_closed_port_is_retryable_and_nothing_was_sent() -> None:
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    outcome = await answer(f"http://127.0.0.1:{port}")
    assert isinstance(outcome, Retryable) and outcome.fault == "connection_refused", outcome
    assert outcome.response["sent"] is False and outcome.response["phase"] == "request"


@pytest.fixture
def silent() -> Iterator[tuple[str, list[bytes]]]:
    """A peer that reads the request and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            got.append(conn.recv(65536))
            stop.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", got
    finally:
        stop.set()
        listener.close()
        thread.join(10)


async def test_no_answer_after_the_request_was_written_is_unknown(silent) -> None:
    url, got = silent
    outcome = await answer(url, timeout=0.3)
    assert isinstance(outcome, Unknown) and outcome.response["sent"] is True, outcome
    assert got and got[0].startswith(b"POST /v2/email/outbound-emails")


async def test_the_deadline_cuts_a_send_that_has_no_answer(silent) -> None:
    url, got = silent
    # Per-read timeouts alone would wait 30 s; the request's deadline ends it. The deadline leaves
    # a loaded machine time to start the request (boto3's first client build takes a while).
    outcome = await answer(url, make_request(deadline=time.monotonic() + 3.0), timeout=30)
    assert isinstance(outcome, Unknown) and outcome.response["sent"] is True, outcome
    assert got


async def _until(condition, bound: float = 10.0) -> None:
    """Wait (ordering, not timing: a generous bound) until ``condition()`` holds."""
    end = time.monotonic() + bound
    while not condition():
        assert time.monotonic() < end, "never happened"
        await asyncio.sleep(0.01)


async def test_close_answers_a_queued_send_retryable_and_cuts_the_live_one(silent) -> None:
    url, got = silent
    p = ses(url, timeout=30, max_workers=1)
    live = asyncio.create_task(p.send(make_request(step_id="live")))
    await _until(lambda: bool(got))  # the one pool thread is in the exchange
    queued = asyncio.create_task(p.send(make_request(step_id="queued")))
    await _until(lambda: len(p._jobs) == 2)  # submitted behind it, never started
    await p.close(grace=0.1)
    first, second = await asyncio.gather(live, queued, return_exceptions=True)
    # The live send's request was written: unknown. The queued one never ran: retryable, not a
    # CancelledError out of send() (the caller's task was not cancelled).
    assert isinstance(first, Unknown) and first.response["sent"] is True, first
    assert isinstance(second, Retryable) and second.response["phase"] == "closed", second
    assert len(got) == 1


async def test_a_cancelled_caller_still_sees_its_cancellation(silent) -> None:
    url, got = silent
    p = ses(url, timeout=30, max_workers=1)
    try:
        live = asyncio.create_task(p.send(make_request(step_id="live")))
        await _until(lambda: bool(got))
        live.cancel()
        with pytest.raises(asyncio.CancelledError):
            await live
    finally:
        await p.close(grace=0.1)


async def test_nothing_is_sent_once_the_send_by_limit_has_passed() -> None:
    with SesErrorPeer() as peer:
        outcome = await answer(peer.url, make_request(send_by=time.monotonic() - 1))
        assert isinstance(outcome, Retryable) and outcome.response["error_class"] == "LeaseTooShort", outcome
        assert peer.requests == []


async def test_a_closed_adapter_sends_nothing_and_says_so() -> None:
    with SesErrorPeer() as peer:
        p = ses(peer.url)
        await p.close()
        outcome = await p.send(make_request())
        assert isinstance(outcome, Retryable) and outcome.response["phase"] == "closed", outcome
        assert peer.requests == []


async def test_the_policy_recheck_and_smtputf8_refuse_before_any_request() -> None:
    with SesErrorPeer() as peer:
        blocked = await answer(peer.url, policy=Policy(blocked_domains=("example.com",), reserved_senders=()))
        utf8 = await answer(peer.url, make_request(to=["josé@example.com"]))
        assert peer.requests == []
    assert isinstance(blocked, Rejected) and blocked.before_send, blocked
    assert isinstance(utf8, Rejected) and utf8.before_send and "SMTPUTF8" in utf8.reason, utf8


async def test_no_credentials_anywhere_is_misconfigured_and_nothing_is_sent(monkeypatch, tmp_path) -> None:
    # The standard AWS chain, with nothing in it: no keys, no profile, no container or instance role.
    for name in [n for n in os.environ if n.startswith("AWS_") and n != "AWS_EC2_METADATA_DISABLED"]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with SesErrorPeer() as peer:
        p = SesProvider(region=REGION, endpoint_url=peer.url, timeout=2.0)
        try:
            outcome = await p.send(make_request())
        finally:
            await p.close()
        assert peer.requests == []
    assert isinstance(outcome, Retryable) and outcome.misconfigured and outcome.fault == "auth_failed", outcome
    assert outcome.response["sent"] is False


async def test_the_credentials_are_in_no_outcome_no_log_and_no_evidence() -> None:
    # Every answer is a refusal that might echo what it got.
    answers = [(403, "UnrecognizedClientException", f"bad key {ACCESS_KEY} / {SECRET_KEY}")] * 2
    with SesErrorPeer(answers) as peer:
        p = ses(peer.url)
        try:
            with structlog.testing.capture_logs() as logs:
                outcomes = [await p.send(make_request(step_id=f"s{i}")) for i in range(2)]
        finally:
            await p.close()
        # The secret only ever travels as a signature; the id in the signed header.
        assert all(SECRET_KEY.encode() not in r["body"] for r in peer.requests)
    text = json.dumps([o.response for o in outcomes] + [o.reason for o in outcomes]) + json.dumps(logs, default=str)
    assert SECRET_KEY not in text and ACCESS_KEY not in text
