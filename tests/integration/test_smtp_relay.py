"""EVQ_SMTP_RELAY over a real SMTP conversation (ops.dev.smtp, aiosmtpd on loopback): each
message the relay receives carries its metadata header with the step key's digest, the same
on every attempt, as the relay parses it (docs/design.md, "Provider profiles")."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from email import policy as email_policy
from email.parser import BytesParser

import pytest

from evq.adapters.smtp import SmtpProvider
from evq.adapters.smtp.message import RELAY_HEADERS, relay_key_digest
from evq.ops import wiring
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.delivery import key_tag
from evq.worker.outcomes import Accepted
from evq.worker.ports import SendRequest
from evq.worker.request import parse
from tests.support import POLICY, request


@pytest.fixture
def server() -> Iterator[DevSmtpServer]:
    with DevSmtpServer() as s:
        yield s


def _request(attempt: int, key_step: str = "relay-1") -> SendRequest:
    valid = parse(request(run_id="run-relay", step_id=key_step), POLICY)
    return SendRequest(
        step_id=11,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=f"<evq.{key_step}@example.org>",
        attempt=attempt,
        payload=valid.payload,
    )


async def _send(provider: SmtpProvider, *requests: SendRequest) -> list:
    try:
        return [await provider.send(r) for r in requests]
    finally:
        await provider.close()


@pytest.mark.parametrize("relay", sorted(RELAY_HEADERS))
def test_every_attempt_through_a_relay_carries_its_header_with_the_key_tag(server, relay):
    provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0, relay=relay)
    outcomes = asyncio.run(_send(provider, _request(1), _request(2)))
    assert all(isinstance(o, Accepted) for o in outcomes), outcomes
    received = [BytesParser(policy=email_policy.default).parsebytes(m["data"]) for m in server.messages]
    assert len(received) == 2
    values = [m.get_all(RELAY_HEADERS[relay]) for m in received]
    assert values[0] == values[1] and len(values[0]) == 1  # one header, the same on both attempts
    assert relay_key_digest(relay, str(values[0][0])) == key_tag("run-relay:relay-1", "<evq.relay-1@example.org>")
    assert b"run-relay:relay-1" not in server.messages[0]["data"]  # the digest, never the key


def test_the_worker_wiring_sends_the_relay_header_the_setting_names(server):
    settings = Settings.load(
        env={"EVQ_SMTP_HOST": "127.0.0.1", "EVQ_SMTP_PORT": str(server.port), "EVQ_SMTP_RELAY": "postmark"}
    )
    provider = wiring.build_providers(settings)["smtp"]
    assert isinstance(provider, SmtpProvider)
    [outcome] = asyncio.run(_send(provider, _request(1, "relay-2")))
    assert isinstance(outcome, Accepted), outcome
    [message] = server.messages
    parsed = BytesParser(policy=email_policy.default).parsebytes(message["data"])
    assert parsed["X-PM-Metadata-evq_key"] == key_tag("run-relay:relay-2", "<evq.relay-2@example.org>")
    assert all(parsed.get(h) is None for r, h in RELAY_HEADERS.items() if r != "postmark")


def test_a_plain_smtp_server_gets_no_relay_header(server):
    provider = SmtpProvider(host="127.0.0.1", port=server.port, timeout=5.0)
    [outcome] = asyncio.run(_send(provider, _request(1, "relay-3")))
    assert isinstance(outcome, Accepted)
    parsed = BytesParser(policy=email_policy.default).parsebytes(server.messages[0]["data"])
    assert all(parsed.get(h) is None for h in RELAY_HEADERS.values())
