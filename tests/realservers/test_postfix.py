"""evq's SMTP adapter against a real Postfix (tests/realservers/postfix.py), not a test double.

Each test is a row of issue 13 ("Talking to real SMTP servers") as an operator meets it:
a strict HELO rule, a private CA, AUTH offered without TLS, a refused recipient, a
recipient limit, internal ids in the message, an internal domain. The adapter is built
from settings through the composition root (ops.wiring), as `evq worker run` builds it.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from evq.adapters.smtp import SmtpProvider
from evq.adapters.smtp import client as smtp_client
from evq.ops.settings import Settings
from evq.ops.wiring import build_providers
from evq.worker import metrics
from evq.worker.backoff import Backoff
from evq.worker.errors import ConfigError, InvalidRequest
from evq.worker.executor import attempt
from evq.worker.outcomes import Accepted, Outcome, Retryable
from evq.worker.ports import SendRequest
from evq.worker.records import ClaimedStep, Transition
from evq.worker.request import Policy, parse
from evq.worker.states import Reason, Status
from evq.worker.transitions import decide
from tests.child import settings_from
from tests.realservers.postfix import DOMAIN, PASSWORD, RECIPIENT_LIMIT, USERNAME, Postfix

INTERNAL = Policy(internal_domains=(DOMAIN,))
_seq = itertools.count(1)


def request(to: list[str], **fields: Any) -> SendRequest:
    n = next(_seq)
    valid = parse(
        {
            "run_id": "pf-run",
            "step_id": f"pf-{n}-{os.getpid()}",
            "from": "agent@example.org",
            "to": to,
            "subject": f"postfix {n}",
            "text": "Hello from evq.\n",
            **fields,
        },
        INTERNAL,
    )
    return SendRequest(
        step_id=n,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=f"<evq.pf{n}.{os.getpid()}@example.org>",
        attempt=1,
        payload=valid.payload,
    )


def settings(postfix: Postfix, port: str = "plain", **env: str) -> Settings:
    return settings_from(
        {
            "EVQ_SMTP_HOST": "127.0.0.1",
            "EVQ_SMTP_PORT": str(postfix.ports[port]),
            "EVQ_SMTP_TIMEOUT": "10",
            "EVQ_INTERNAL_DOMAINS": DOMAIN,
            **env,
        }
    )


def send(provider: SmtpProvider, req: SendRequest) -> Outcome:
    async def run() -> Outcome:
        try:
            outcome, _ = await attempt(provider, req, deadline=60)
            return outcome
        finally:
            await provider.close()

    return asyncio.run(run())


def send_with(postfix: Postfix, req: SendRequest, port: str = "plain", **env: str) -> Outcome:
    return send(build_providers(settings(postfix, port, **env))["smtp"], req)


def transition_of(outcome: Outcome) -> Transition:
    """What the worker records for this answer (the pure rule of worker/transitions.py)."""
    step = ClaimedStep(
        id=1,
        run_id="r",
        step_id="s",
        idempotency_key="r:s",
        message_id="<m@example.org>",
        provider="smtp",
        payload={},
        attempt=1,
        max_attempts=5,
        lease_token=uuid.uuid4(),
        lease_seconds=60,
        dedupe_remaining=None,
        maybe_delivered=False,
        created_at=datetime.now(UTC),
    )
    return decide(step, outcome, default_max_attempts=5, backoff=Backoff(0, 0), dedupe_window_open=False)


# -- HELO ----------------------------------------------------------------------


def test_the_default_greeting_passes_reject_non_fqdn_helo_hostname(postfix: Postfix) -> None:
    """On a host whose name has no dot (a container's, this machine's) evq greets with the
    connection's address literal; on one with a fully-qualified name, with that name."""
    req = request([f"helo-default@{DOMAIN}"])
    outcome = send_with(postfix, req)

    assert isinstance(outcome, Accepted), outcome
    [delivered] = postfix.delivered(req.message_id, expect=1)
    # Postfix's Received: header names the HELO it was given first.
    expected = smtp_client.default_helo() or "[127.0.0.1]"
    assert delivered["Received"].startswith(f"from {expected} (")


def test_the_helo_name_setting_is_what_the_server_sees(postfix: Postfix) -> None:
    req = request([f"helo-set@{DOMAIN}"])
    outcome = send_with(postfix, req, EVQ_SMTP_HELO_NAME="worker-7.evq.test")

    assert isinstance(outcome, Accepted), outcome
    [delivered] = postfix.delivered(req.message_id, expect=1)
    assert delivered["Received"].startswith("from worker-7.evq.test (")
    with pytest.raises(ConfigError, match="EVQ_SMTP_HELO_NAME"):
        settings(postfix, EVQ_SMTP_HELO_NAME="localhost")


def test_a_refused_helo_name_is_the_providers_configuration_not_the_message(postfix: Postfix) -> None:
    """Postfix answers 504 5.5.2 "Helo command rejected" at RCPT time (smtpd_delay_reject):
    that is no refusal of the message; it stays retryable, nothing was sent."""
    req = request([f"helo-bad@{DOMAIN}"])
    start = len(postfix.log_lines())
    provider = SmtpProvider(
        host="127.0.0.1", port=postfix.ports["plain"], timeout=10, policy=INTERNAL, helo_name="localhost"
    )
    outcome = send(provider, req)

    assert isinstance(outcome, Retryable), outcome
    assert outcome.misconfigured and outcome.response["code"] == 504
    assert outcome.response["error_class"] == "HeloRefused" and "EVQ_SMTP_HELO_NAME" in outcome.reason
    transition = transition_of(outcome)
    assert transition.to_status is Status.RETRYABLE and transition.reason is Reason.PROVIDER_MISCONFIGURED
    [line] = postfix.wait_log(lambda line: "Helo command rejected" in line, after=start)
    assert f"to=<helo-bad@{DOMAIN}>" in line and "helo=<localhost>" in line
    [session] = postfix.wait_log(lambda line: "disconnect from" in line, after=start)
    assert "data=" not in session  # the RSET came before any DATA: nothing was queued


# -- TLS and AUTH ----------------------------------------------------------------


def test_starttls_with_a_private_ca_and_sasl_auth(postfix: Postfix) -> None:
    req = request([f"tls-ca@{DOMAIN}"])
    outcome = send_with(
        postfix,
        req,
        EVQ_SMTP_TLS="starttls",
        EVQ_SMTP_CA_FILE=postfix.ca.ca_file,
        EVQ_SMTP_USERNAME=USERNAME,
        EVQ_SMTP_PASSWORD=PASSWORD,
    )

    assert isinstance(outcome, Accepted), outcome
    assert len(postfix.delivered(req.message_id, expect=1)) == 1
    assert postfix.wait_log(lambda line: f"sasl_username={USERNAME}" in line)
    assert PASSWORD not in repr(outcome)


def test_without_the_ca_file_the_private_certificate_is_refused_as_misconfiguration(postfix: Postfix) -> None:
    req = request([f"tls-noca@{DOMAIN}"])
    outcome = send_with(postfix, req, EVQ_SMTP_TLS="starttls")

    assert isinstance(outcome, Retryable) and outcome.misconfigured, outcome
    assert outcome.response["error_class"] == "SSLCertVerificationError" and "EVQ_SMTP_CA_FILE" in outcome.reason
    assert postfix.delivered(req.message_id, expect=0) == []


def test_implicit_tls_with_a_private_ca(postfix: Postfix) -> None:
    req = request([f"smtps@{DOMAIN}"])
    outcome = send_with(postfix, req, port="smtps", EVQ_SMTP_TLS="ssl", EVQ_SMTP_CA_FILE=postfix.ca.ca_file)

    assert isinstance(outcome, Accepted), outcome
    assert len(postfix.delivered(req.message_id, expect=1)) == 1


def test_a_server_that_requires_a_client_certificate(postfix: Postfix) -> None:
    without, with_cert = request([f"ccert-no@{DOMAIN}"]), request([f"ccert-yes@{DOMAIN}"])
    refused = send_with(postfix, without, port="ccert", EVQ_SMTP_TLS="starttls", EVQ_SMTP_CA_FILE=postfix.ca.ca_file)
    accepted = send_with(
        postfix,
        with_cert,
        port="ccert",
        EVQ_SMTP_TLS="starttls",
        EVQ_SMTP_CA_FILE=postfix.ca.ca_file,
        EVQ_SMTP_CLIENT_CERT=postfix.ca.client_cert,
        EVQ_SMTP_CLIENT_KEY=postfix.ca.client_key,
    )

    assert isinstance(refused, Retryable), refused
    assert isinstance(accepted, Accepted), accepted
    assert len(postfix.delivered(with_cert.message_id, expect=1)) == 1
    assert postfix.delivered(without.message_id, expect=0) == []


def test_auth_without_tls_is_refused_before_the_password_leaves(postfix: Postfix) -> None:
    """Postfix offers AUTH before STARTTLS here (smtpd_tls_auth_only = no): evq must not use it."""
    with pytest.raises(ConfigError, match="EVQ_SMTP_ALLOW_PLAIN_AUTH"):
        settings(postfix, EVQ_SMTP_USERNAME=USERNAME, EVQ_SMTP_PASSWORD=PASSWORD)
    req = request([f"plain-auth@{DOMAIN}"])
    start = len(postfix.log_lines())
    provider = SmtpProvider(
        host="127.0.0.1", port=postfix.ports["plain"], timeout=10, policy=INTERNAL, username=USERNAME, password=PASSWORD
    )
    outcome = send(provider, req)

    assert isinstance(outcome, Retryable) and outcome.misconfigured, outcome
    assert outcome.response["phase"] == "auth" and outcome.response["error_class"] == "PlainAuthRefused"
    # smtpd's own count of the session's commands: no AUTH was ever attempted, no MAIL either.
    [session] = postfix.wait_log(lambda line: "disconnect from" in line, after=start)
    assert "auth=" not in session and "mail=" not in session, session
    assert postfix.delivered(req.message_id, expect=0) == []

    allowed = request([f"plain-auth-ok@{DOMAIN}"])
    outcome = send_with(
        postfix, allowed, EVQ_SMTP_USERNAME=USERNAME, EVQ_SMTP_PASSWORD=PASSWORD, EVQ_SMTP_ALLOW_PLAIN_AUTH="true"
    )
    assert isinstance(outcome, Accepted), outcome


# -- recipients ----------------------------------------------------------------


def test_a_partial_refusal_is_accepted_with_the_refused_recipients_named(postfix: Postfix) -> None:
    req = request([f"partial-ok@{DOMAIN}", f"refused@{DOMAIN}"])
    counter = metrics.RECIPIENTS_REFUSED.labels(provider="smtp")
    before = counter._value.get()
    outcome = send_with(postfix, req)

    assert isinstance(outcome, Accepted), outcome
    [delivered] = postfix.delivered(req.message_id, expect=1)
    assert delivered["Delivered-To"] == f"partial-ok@{DOMAIN}"
    refused = outcome.response["refused"]
    assert list(refused) == [f"refused@{DOMAIN}"] and refused[f"refused@{DOMAIN}"]["code"] == 550
    assert "5.1.1" in refused[f"refused@{DOMAIN}"]["reply"]
    transition = transition_of(outcome)
    assert transition.to_status is Status.ACCEPTED and transition.reason is Reason.PARTIALLY_REFUSED
    assert f"refused@{DOMAIN} (550" in transition.detail["message"]
    assert counter._value.get() == before + 1


def test_452_too_many_recipients_sends_the_rest_in_further_transactions(postfix: Postfix) -> None:
    """smtpd_recipient_limit = 2: five recipients take three transactions, one Message-ID."""
    recipients = [f"many-{i}@{DOMAIN}" for i in range(5)]
    req = request(recipients)
    outcome = send_with(postfix, req, port="limited")

    assert isinstance(outcome, Accepted), outcome
    assert outcome.response["accepted"] == 5 and not outcome.response["refused"]
    transactions = outcome.response["transactions"]
    assert [t["recipients"] for t in transactions] == [RECIPIENT_LIMIT, RECIPIENT_LIMIT, 1]
    assert outcome.provider_message_id == transactions[0]["queue_id"]
    delivered = postfix.delivered(req.message_id, expect=5)
    assert sorted(m["Delivered-To"] for m in delivered) == sorted(recipients)
    assert len(postfix.sessions_for(req.message_id, expect=3)) == 3  # three queued copies, each to its share
    # What ended the first two transactions' RCPTs: Postfix's own 452 4.5.3.
    limit = transactions[0]["deferred_by"]
    assert limit["code"] == 452 and "4.5.3" in limit["reply"] and limit["deferred"] == 3
    assert transactions[2]["deferred_by"] is None


def test_a_refusal_in_a_later_transaction_leaves_the_step_accepted_and_names_it(postfix: Postfix) -> None:
    recipients = [f"later-0@{DOMAIN}", f"later-1@{DOMAIN}", f"refused@{DOMAIN}", f"later-3@{DOMAIN}"]
    req = request(recipients)
    outcome = send_with(postfix, req, port="limited")

    assert isinstance(outcome, Accepted), outcome
    assert list(outcome.response["refused"]) == [f"refused@{DOMAIN}"]
    delivered = postfix.delivered(req.message_id, expect=3)
    assert sorted(m["Delivered-To"] for m in delivered) == sorted(set(recipients) - {f"refused@{DOMAIN}"})


# -- the message ---------------------------------------------------------------


def test_the_delivered_message_carries_no_internal_ids(postfix: Postfix) -> None:
    req = request([f"ids@{DOMAIN}"])
    assert isinstance(send_with(postfix, req), Accepted)

    [delivered] = postfix.delivered(req.message_id, expect=1)
    raw = delivered.as_bytes()
    assert req.idempotency_key.encode() not in raw and b"pf-run" not in raw
    assert not [k for k in delivered.keys() if k.lower().startswith("x-evq")]
    assert delivered["Message-ID"] == req.message_id


def test_internal_domains_are_refused_unless_named(postfix: Postfix) -> None:
    data = {"run_id": "r", "step_id": "s", "from": "a@example.org", "to": [f"x@{DOMAIN}"], "subject": "s", "text": "t"}
    with pytest.raises(InvalidRequest, match="special-use"):
        parse(data)
    assert settings(postfix).policy().internal_domains == (DOMAIN,)
    assert parse(data, settings(postfix).policy()).payload["to"][0]["email"] == f"x@{DOMAIN}"
    with pytest.raises(InvalidRequest, match="special-use"):
        parse({**data, "to": ["x@other.test"]}, settings(postfix).policy())
