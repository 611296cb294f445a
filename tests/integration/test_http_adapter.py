"""The HTTP adapter against a real Resend-style API on loopback (ops.dev.http).

One test per classification row of adapters/http/provider.py, each made to happen by the
server, plus the wire guarantees: the same key and byte-identical body on every
attempt, the provider deduplicating by it, the tag carrying it, the lookup, the
policy re-check, and no API key anywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import structlog

from evq.adapters.http import TAG_NAME, HttpProvider, WireKeys, legacy_wire_key, tag_value
from evq.ops.dev.http import DevHttpServer
from evq.worker.delivery import key_tag
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.ports import Lookup, LookupFailed, Provider, SendRequest
from evq.worker.request import Policy, parse
from tests.support import WIRE_KEYS, refusing_port

API_KEY = "devhttp-key-0123456789-secret"


def make_request(*, step_id: str = "hello", attempt: int = 1, **fields: Any) -> SendRequest:
    data: dict[str, Any] = {
        "run_id": "run-1",
        "step_id": step_id,
        "from": "Evq Sender <sender@example.org>",
        "to": ["ok@example.com"],
        "subject": "Hello",
        "text": "Hi there.",
        **fields,
    }
    valid = parse(data, Policy(reserved_senders=()))  # a stored payload; evq's own notices included
    return SendRequest(
        step_id=7,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=f"<evq.{step_id}@example.org>",
        attempt=attempt,
        payload=valid.payload,
    )


@pytest.fixture
def server() -> Iterator[DevHttpServer]:
    with DevHttpServer(api_key=API_KEY, slow_seconds=2.0, retry_after=7) as s:
        yield s


@pytest.fixture
async def provider(server: DevHttpServer) -> AsyncIterator[HttpProvider]:
    p = HttpProvider(base_url=server.url, api_key=API_KEY, timeout=0.5, dedupe_window=3600, wire_keys=WIRE_KEYS)
    try:
        yield p
    finally:
        await p.close()


async def test_provider_satisfies_the_ports(provider: HttpProvider) -> None:
    assert isinstance(provider, Provider) and isinstance(provider, Lookup)
    assert provider.name == "http" and provider.dedupe_window == 3600
    assert API_KEY not in repr(provider)


async def test_zero_window_means_the_provider_does_not_dedupe(server: DevHttpServer) -> None:
    p = HttpProvider(base_url=server.url, api_key=API_KEY, dedupe_window=0, wire_keys=WIRE_KEYS)
    assert p.dedupe_window is None
    await p.close()


async def test_a_closed_adapter_sends_nothing_and_says_so(server: DevHttpServer) -> None:
    p = HttpProvider(base_url=server.url, api_key=API_KEY, wire_keys=WIRE_KEYS)
    await p.close()
    outcome = await p.send(make_request())
    assert isinstance(outcome, Retryable) and "closed" in outcome.reason and server.requests == []


# -- classification ----------------------------------------------------------


async def test_2xx_is_accepted_with_the_providers_id(provider, server) -> None:
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Accepted)
    [message] = server.messages
    assert outcome.provider_message_id == message["id"]
    # Visibly a test id, never the shape of a real provider's (Resend's is a UUID).
    assert re.fullmatch(r"test_[0-9a-f]{24}", message["id"])
    assert outcome.response["code"] == 200 and outcome.response["sent"] is True
    # The request as the provider saw it: key in the header and in a tag, Message-ID kept.
    [post] = server.posts()
    assert post["idempotency_key"] == WIRE_KEYS.key(7, "run-1:hello")
    assert message["tags"] == [{"name": TAG_NAME, "value": key_tag("run-1:hello", "<evq.hello@example.org>")}]
    assert message["headers"]["X-Evq-Message-Id"] == "<evq.hello@example.org>"
    assert message["from"] == '"Evq Sender" <sender@example.org>' and message["to"] == ["ok@example.com"]


@pytest.mark.parametrize("status", ["400", "422"])
async def test_400_and_422_are_rejected(provider, server, status) -> None:
    server.queue_fault(status)
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Rejected) and not outcome.before_send
    assert outcome.response["code"] == int(status) and "validation_error" in outcome.reason


async def test_409_same_key_different_payload_is_rejected_loudly(provider, server) -> None:
    assert isinstance(await provider.send(make_request(text="first body")), Accepted)
    with structlog.testing.capture_logs() as logs:
        outcome = await provider.send(make_request(text="a different body"))  # same step, same key
    assert isinstance(outcome, Rejected) and "different body" in outcome.reason
    assert outcome.response["error_name"] == "invalid_idempotent_request"
    assert [e["log_level"] for e in logs if e["event"] == "http_idempotency_key_reused"] == ["error"]
    assert len(server.messages) == 1


async def test_409_still_in_progress_is_retryable(provider, server) -> None:
    server.queue_fault("409-in-progress")
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Retryable) and "concurrent_idempotent_requests" in outcome.reason
    assert server.messages == []


async def test_429_is_retryable_after_the_retry_after(provider, server) -> None:
    server.queue_fault("429")
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Retryable) and outcome.retry_after == 7
    # Too fast is the provider's state, not this message's: it pauses the whole provider.
    assert outcome.throttled
    assert server.messages == []


async def test_only_a_429_says_the_provider_is_throttled(provider, server) -> None:
    for fault in ("500", "409-in-progress"):
        server.queue_fault(fault)
        outcome = await provider.send(make_request())
        assert isinstance(outcome, Retryable) and not outcome.throttled, fault


async def test_5xx_with_the_providers_error_is_retryable(provider, server) -> None:
    server.queue_fault("500")
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Retryable) and outcome.response["code"] == 500
    assert server.messages == []


async def test_5xx_from_a_gateway_is_ambiguous(provider, server) -> None:
    """A 502 page that is not the provider's own error: the provider behind it may have acted (it did)."""
    server.queue_fault("502")
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Unknown) and outcome.response["code"] == 502
    assert len(server.messages) == 1


async def test_connection_refused_is_retryable_and_never_sent() -> None:
    with refusing_port() as port:
        p = HttpProvider(base_url=f"http://127.0.0.1:{port}", api_key=API_KEY, timeout=0.5, wire_keys=WIRE_KEYS)
        try:
            outcome = await p.send(make_request())
        finally:
            await p.close()
    assert isinstance(outcome, Retryable) and outcome.response["sent"] is False
    assert "before the request was sent" in outcome.reason and outcome.response["error_class"] == "ConnectError"
    assert outcome.fault == "connection_refused"


async def test_reset_after_the_request_was_sent_is_ambiguous(provider, server) -> None:
    server.queue_fault("reset")
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Unknown) and outcome.response["sent"] is True
    assert "after the request was sent" in outcome.reason
    assert len(server.messages) == 1  # the provider did take it


async def test_timeout_after_the_request_was_sent_is_ambiguous(provider, server) -> None:
    server.queue_fault("slow", seconds=2.0)  # the client gives up after 0.5 s
    outcome = await provider.send(make_request())
    assert isinstance(outcome, Unknown) and outcome.response["error_class"] == "ReadTimeout"
    assert len(server.messages) == 1


async def test_bad_credentials_are_retryable_and_logged_as_configuration(server) -> None:
    p = HttpProvider(base_url=server.url, api_key="not-the-key", timeout=0.5, wire_keys=WIRE_KEYS)
    try:
        with structlog.testing.capture_logs() as logs:
            outcome = await p.send(make_request())
    finally:
        await p.close()
    assert isinstance(outcome, Retryable) and outcome.response["code"] == 401
    assert outcome.fault == "auth_failed"
    assert "EVQ_HTTP_API_KEY" in outcome.reason
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["http_config_failure"]


async def test_policy_recheck_refuses_before_any_request(server) -> None:
    p = HttpProvider(
        base_url=server.url, api_key=API_KEY, policy=Policy(blocked_domains=("example.com",)), wire_keys=WIRE_KEYS
    )
    try:
        outcome = await p.send(make_request())
    finally:
        await p.close()
    assert isinstance(outcome, Rejected) and outcome.before_send and "blocked" in outcome.reason
    assert server.requests == []


async def test_the_reserved_notice_sender_passes_the_recheck(provider, server) -> None:
    """Reserved senders are refused from callers at enqueue, not from evq's own notices at send."""
    reserved = HttpProvider(
        base_url=server.url, api_key=API_KEY, policy=Policy(reserved_senders=("evq-notices@",)), wire_keys=WIRE_KEYS
    )
    try:
        outcome = await reserved.send(make_request(**{"from": "evq-notices@example.org"}))
    finally:
        await reserved.close()
    assert isinstance(outcome, Accepted)


# -- idempotency on the wire ---------------------------------------------------


async def test_every_attempt_sends_the_same_key_and_body_and_the_provider_sends_once(provider, server) -> None:
    first = await provider.send(make_request(attempt=1))
    again = await provider.send(make_request(attempt=2))
    assert isinstance(first, Accepted) and isinstance(again, Accepted)
    assert again.provider_message_id == first.provider_message_id
    assert len(server.posts(WIRE_KEYS.key(7, "run-1:hello"))) == 2 and len(server.messages) == 1


async def test_the_wire_key_is_keyed_by_the_installation_and_no_caller_can_choose_it(provider, server) -> None:
    """Issue 29: the Idempotency-Key is evq1- and an HMAC of the step's key, whatever its length
    or script: a caller's literal key never reaches the provider as it is, and another
    installation (another pepper) sends another key for the same step key."""
    keys = ("run-1:ok", "k" * 300, "ключ-1", "sha256:" + tag_value("run-1:victim"))
    for key in keys:
        sent = WIRE_KEYS.key(7, key)
        assert re.fullmatch(r"evq1-[0-9a-f]{64}", sent) and key not in sent
    assert len({WIRE_KEYS.key(7, k) for k in keys}) == len(keys)
    other = WireKeys.from_pepper(b"another installation's pepper".ljust(32, b"!"), keyed_from=1)
    assert other.key(7, "run-1:ok") != WIRE_KEYS.key(7, "run-1:ok")
    assert isinstance(await provider.send(make_request(idempotency_key="ключ-1")), Accepted)
    assert server.posts()[0]["idempotency_key"] == WIRE_KEYS.key(7, "ключ-1")


def test_a_step_enqueued_before_the_keyed_form_keeps_the_key_it_may_have_been_sent_under() -> None:
    """Steps below ``keyed_from`` (api_key_pepper.wire_keys_from: evq 0.2.0's steps) keep the old
    form on every attempt: a new key inside the provider's window would be a second send."""
    keys = WireKeys.from_pepper(b"p" * 32, keyed_from=8)
    long_key = "k" * 300
    assert keys.key(7, "run-1:ok") == legacy_wire_key("run-1:ok") == "run-1:ok"
    assert keys.key(7, long_key) == legacy_wire_key(long_key) == "sha256:" + tag_value(long_key)
    assert keys.key(7, "ключ").startswith("sha256:")
    assert keys.key(8, "run-1:ok").startswith("evq1-")
    with pytest.raises(ValueError):
        WireKeys.from_pepper(b"short", keyed_from=1)


async def test_the_api_key_is_in_no_outcome_and_no_log(server) -> None:
    server.api_key = "other"  # every answer is a refusal that might echo what it got
    p = HttpProvider(base_url=server.url, api_key=API_KEY, timeout=0.5, wire_keys=WIRE_KEYS)
    try:
        with structlog.testing.capture_logs() as logs:
            outcomes = [await p.send(make_request(step_id=f"s{i}")) for i in range(2)]
            with pytest.raises(LookupFailed):
                await p.lookup("run-1:s0", "<m@x>")
    finally:
        await p.close()
    assert API_KEY not in json.dumps([o.response for o in outcomes] + [o.reason for o in outcomes])
    assert API_KEY not in json.dumps(logs, default=str)


# -- lookup ---------------------------------------------------------------------


async def test_lookup_finds_the_message_by_the_tag_carrying_the_key(provider, server) -> None:
    sent = await provider.send(make_request())
    await provider.send(make_request(step_id="other"))
    found = await provider.lookup("run-1:hello", "<evq.hello@example.org>")
    assert found.found and found.provider_message_id == sent.provider_message_id
    assert found.raw["email"]["id"] == sent.provider_message_id and found.raw["query"].startswith(TAG_NAME + ":")
    absent = await provider.lookup("run-1:never-sent", "<evq.never@example.org>")
    assert not absent.found and absent.provider_message_id is None and absent.raw["listed"] == 0


async def test_lookup_reads_the_message_when_the_list_omits_tags(provider, server) -> None:
    sent = await provider.send(make_request())
    server.lookup_fault = "no-tags"
    found = await provider.lookup("run-1:hello", "<evq.hello@example.org>")
    assert found.found and found.provider_message_id == sent.provider_message_id
    assert [r["path"].split("?")[0] for r in server.requests if r["method"] == "GET"] == [
        "/emails",
        f"/emails/{sent.provider_message_id}",
    ]


async def test_a_provider_that_ignores_the_filter_settles_nothing(provider, server) -> None:
    await provider.send(make_request(step_id="someone-else"))
    server.lookup_fault = "ignore-filter"
    result = await provider.lookup("run-1:hello", "<evq.hello@example.org>")
    assert not result.found and result.raw["listed"] == 2  # listed once per form of the tag asked for


async def test_a_lookup_that_cannot_be_answered_raises(provider, server) -> None:
    server.lookup_fault = "500"
    with pytest.raises(LookupFailed, match="http 500"):
        await provider.lookup("run-1:hello", "<evq.hello@example.org>")
    server.stop()
    with pytest.raises(LookupFailed, match="ConnectError"):
        await provider.lookup("run-1:hello", "<evq.hello@example.org>")
