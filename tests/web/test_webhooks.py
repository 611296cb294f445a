"""POST /v1/webhooks/{provider} over real HTTP against the real `evq serve` app (issue 16):
for each provider a step left ``unknown`` by a lost answer is settled ``accepted`` (reason
``webhook``) by a signed event, while a forged and a replayed request are refused, counted,
and change nothing; an unconfigured provider is 404, an oversized body 413, a database that
refuses writes 503 (and the provider's retry then lands)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jsonschema
import pytest

from evq.ops.web.webhooks import RECEIVED
from evq.worker.delivery import key_tag
from tests import providerhooks as hooks
from tests.acceptance.conftest import make_key
from tests.support import evidence_kinds, rows, sample, scrape, step_row, unknown_steps, wait_until, with_store
from tests.web.support import serving

Signed = tuple[dict[str, str], bytes, dict[str, str]]  # headers, body, query


def make_unknown(db_url: str, provider: str = "smtp") -> Any:
    at = datetime.now(UTC) - timedelta(hours=1)
    [step] = with_store(db_url, lambda store: unknown_steps(store, 1, now=at, provider=provider))
    assert step_row(db_url, step.id)["status"] == "unknown"
    return step


class Case:
    """One provider: its settings, the step provider whose messages its events report (the
    http adapter for Resend, SES itself, smtp through the relay EVQ_SMTP_RELAY names), and how
    it signs a delivered event about a step (good, forged, replayed)."""

    def __init__(
        self,
        name: str,
        settings: dict[str, Any],
        sign: Callable[..., Signed],
        forge: Callable[..., Signed],
        step_provider: str = "smtp",
    ):
        self.name, self.settings, self.sign, self.forge = name, settings, sign, forge
        self.step_provider = step_provider


def resend_case(_sns: Any) -> Case:
    def event(step: Any) -> dict[str, Any]:
        data = {
            "email_id": "re_1",
            "to": ["u@example.com"],
            "tags": {"evq_key": key_tag(step.idempotency_key, step.message_id)},
        }
        return {"type": "email.delivered", "created_at": "2026-12-01T10:00:00Z", "data": data}

    def sign(step: Any, *, old: bool = False) -> Signed:
        headers, body = hooks.resend(event(step), at=hooks.now_unix() - 3600 if old else None)
        return headers, body, {}

    def forge(step: Any) -> Signed:
        headers, body = hooks.resend(event(step), secret="whsec_" + "Zm9yZ2VkLXNlY3JldC1vZi1hbi1hdHRhY2tlcg==")
        return headers, body, {}

    return Case("resend", {"webhook_resend_secret": hooks.RESEND_SECRET}, sign, forge, step_provider="http")


def sendgrid_case(_sns: Any) -> Case:
    key, other = hooks.SendGridKey(), hooks.SendGridKey()

    def events(step: Any) -> list[dict[str, Any]]:
        return [
            {
                "event": "delivered",
                "sg_event_id": "sg-" + step.step_id,
                "email": "u@example.com",
                "timestamp": hooks.now_unix(),
                "evq_key": key_tag(step.idempotency_key, step.message_id),
                "smtp-id": step.message_id,
            }
        ]

    def sign(step: Any, *, old: bool = False) -> Signed:
        headers, body = key.sign(events(step), at=hooks.now_unix() - 3600 if old else None)
        return headers, body, {}

    def forge(step: Any) -> Signed:
        headers, body = other.sign(events(step))
        return headers, body, {}

    return Case("sendgrid", {"webhook_sendgrid_public_key": key.public, "smtp_relay": "sendgrid"}, sign, forge)


def postmark_case(_sns: Any) -> Case:
    def record(step: Any) -> dict[str, Any]:
        return {
            "RecordType": "Delivery",
            "MessageID": "pm-" + step.step_id,
            "Recipient": "u@example.com",
            "DeliveredAt": "2026-12-01T10:00:00Z",
            "Metadata": {"evq_key": key_tag(step.idempotency_key, step.message_id)},
        }

    def sign(step: Any, *, old: bool = False) -> Signed:
        # Postmark signs nothing and sends no timestamp: a replay is the same request again.
        headers, body = hooks.postmark(record(step))
        return headers, body, {}

    def forge(step: Any) -> Signed:
        headers, body = hooks.postmark(record(step), password="a-guessed-password-1234")
        return headers, body, {}

    settings = {
        "webhook_postmark_user": hooks.POSTMARK_USER,
        "webhook_postmark_password": hooks.POSTMARK_PASSWORD,
        "smtp_relay": "postmark",
    }
    return Case("postmark", settings, sign, forge)


def mailgun_case(_sns: Any) -> Case:
    def event(step: Any) -> dict[str, Any]:
        return {
            "id": "mg-" + step.step_id,
            "event": "delivered",
            "timestamp": hooks.now_unix(),
            "recipient": "u@example.com",
            "user-variables": {"evq_key": key_tag(step.idempotency_key, step.message_id)},
            "message": {"headers": {"message-id": step.message_id.strip("<>")}},
        }

    def sign(step: Any, *, old: bool = False) -> Signed:
        headers, body = hooks.mailgun(event(step), at=hooks.now_unix() - 3600 if old else None)
        return headers, body, {}

    def forge(step: Any) -> Signed:
        headers, body = hooks.mailgun(event(step), key="not-the-signing-key-at-all-0000")
        return headers, body, {}

    return Case("mailgun", {"webhook_mailgun_signing_key": hooks.MAILGUN_KEY, "smtp_relay": "mailgun"}, sign, forge)


def ses_case(sns: Any) -> Case:
    def sign(step: Any, *, old: bool = False) -> Signed:
        # Matched by the Message-ID alone here: SES's tags are covered by the unit tests.
        event = hooks.ses_event("Delivery", message_id=step.message_id)
        message = sns.message(event, at=datetime.now(UTC) - timedelta(hours=3) if old else None)
        return {"content-type": "text/plain; charset=UTF-8"}, json.dumps(message).encode(), {}

    def forge(step: Any) -> Signed:
        headers, body, _ = sign(step)
        message = json.loads(body)
        message["Message"] = message["Message"].replace("Delivery", "Bounce")
        return headers, json.dumps(message).encode(), {}

    # An smtp step relayed through SES (the ses adapter's own steps: tests/conformance, the unit tests).
    return Case("ses", {**sns.settings(), "smtp_relay": "ses"}, sign, forge)


CASES = [resend_case, sendgrid_case, postmark_case, mailgun_case, ses_case]


def post(client: httpx.Client, provider: str, signed: Signed) -> httpx.Response:
    headers, body, query = signed
    return client.post(f"/v1/webhooks/{provider}", content=body, headers=headers, params=query)


def refused_count(url: str, provider: str, reason: str) -> float:
    return sample(scrape(url + "/metrics"), "evq_webhook_refused_total", provider=provider, reason=reason) or 0.0


@pytest.mark.parametrize("make", CASES, ids=lambda make: make.__name__.removesuffix("_case"))
def test_a_signed_event_settles_an_unknown_step_and_forged_or_replayed_ones_change_nothing(db_url, sns, make, capfd):
    case = make(sns)
    step = make_unknown(db_url, case.step_provider)
    with serving(db_url, **case.settings) as served:
        client = served.client()
        forged_before = refused_count(served.url, case.name, "bad_signature")
        forged = post(client, case.name, case.forge(step))
        assert forged.status_code == 401, forged.text
        body = forged.json()
        assert body["status"] == "error" and body["error"]["code"] == "E_AUTH_FAILED"
        assert body["error"]["context"] == {"provider": case.name, "reason": "bad_signature"}
        assert refused_count(served.url, case.name, "bad_signature") == forged_before + 1
        # Neither the settings' secrets nor the peer's bytes come back in the answer or the log.
        out, err = capfd.readouterr()
        logged = out + err
        assert "webhook_refused" in logged
        secrets = [v for v in case.settings.values() if isinstance(v, str) and len(v) > 12]
        for text in (forged.text, logged):
            assert not [v for v in secrets if v in text]
            assert step.message_id not in text and "u@example.com" not in text
        if case.name != "postmark":
            replayed = post(client, case.name, case.sign(step, old=True))
            assert replayed.status_code == 401 and replayed.json()["error"]["context"]["reason"] == "replayed"
        assert step_row(db_url, step.id)["status"] == "unknown"
        assert rows(db_url, "SELECT count(*)::int AS n FROM delivery_events") == [{"n": 0}]

        signed = case.sign(step)
        answer = post(client, case.name, signed)
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert got["status"] == "success"
        jsonschema.validate(got["data"], RECEIVED["properties"]["data"])  # as /openapi.json documents it
        [entry] = got["data"]
        assert (entry["type"], entry["matched"], entry["step"], entry["closed"]) == ("delivered", True, step.id, True)
        row = step_row(db_url, step.id)
        assert (row["status"], row["reason"]) == ("accepted", "webhook")
        assert "delivery_event" in evidence_kinds(db_url, step.id)

        # The provider's retry of the same event is a duplicate: stored once, nothing more changes.
        again = post(client, case.name, signed)
        assert again.status_code == 200 and again.json()["data"][0]["duplicate"] is True
    assert rows(db_url, "SELECT count(*)::int AS n FROM delivery_events") == [{"n": 1}]


def test_unconfigured_and_unknown_providers_are_404_and_the_route_needs_no_api_key(db_url):
    with serving(db_url) as served:
        client = served.client()
        for provider in ("resend", "ses"):
            answer = client.post(f"/v1/webhooks/{provider}", content=b"{}")
            assert answer.status_code == 404
            assert answer.json()["error"]["context"] == {"provider": provider, "reason": "not_configured"}
        other = client.post("/v1/webhooks/nosuch", content=b"{}")
        assert other.status_code == 404 and other.json()["error"]["context"]["reason"] == "unknown_provider"
        assert refused_count(served.url, "other", "unknown_provider") >= 1
        admin = make_key(db_url, "root", "admin", created_by=None)
        doc = served.client(admin).get("/openapi.json").json()
        operation = doc["paths"]["/v1/webhooks/{provider}"]["post"]
        assert operation["security"] == [] and operation["operationId"] == "webhooks.receive"
        assert {"200", "401", "404", "413", "503"} <= set(operation["responses"])


def test_an_oversized_body_is_refused_before_it_is_read_whole(db_url):
    with serving(db_url, webhook_mailgun_signing_key=hooks.MAILGUN_KEY, webhook_max_body=4096) as served:
        client = served.client()
        big = b"x" * 5000
        answer = client.post("/v1/webhooks/mailgun", content=big)
        assert answer.status_code == 413 and answer.json()["error"]["context"]["reason"] == "too_large"
        assert answer.json()["error"]["code"] == "E_INVALID_ARG"

        def chunks():  # no Content-Length: refused as the bytes arrive
            for _ in range(10):
                yield b"y" * 1000

        streamed = client.post("/v1/webhooks/mailgun", content=chunks())
        assert streamed.status_code == 413 and streamed.json()["error"]["context"]["reason"] == "too_large"


def test_a_database_refusing_writes_answers_503_and_the_providers_retry_lands(db_url):
    """The provider retries anything but a 2xx, so a 503 loses nothing."""
    from tests.faults.test_database_faults import read_only

    step = make_unknown(db_url)
    headers, body = hooks.mailgun(
        {
            "id": "mg-ro",
            "event": "delivered",
            "timestamp": hooks.now_unix(),
            "user-variables": {"evq_key": key_tag(step.idempotency_key, step.message_id)},
        }
    )
    read_only(db_url, True)
    try:
        with serving(db_url, webhook_mailgun_signing_key=hooks.MAILGUN_KEY, smtp_relay="mailgun") as served:
            client = served.client()
            down = client.post("/v1/webhooks/mailgun", content=body, headers=headers)
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "E_DB_UNAVAILABLE"
            assert step_row(db_url, step.id)["status"] == "unknown"
            read_only(db_url, False)
            wait_until(
                lambda: client.post("/v1/webhooks/mailgun", content=body, headers=headers).status_code == 200,
                what="the retried webhook to be stored",
            )
    finally:
        read_only(db_url, False)
    row = step_row(db_url, step.id)
    assert (row["status"], row["reason"]) == ("accepted", "webhook")


def test_an_sns_subscription_is_confirmed_through_the_route(db_url, sns):
    with serving(db_url, **sns.settings()) as served:
        message = sns.message(kind="SubscriptionConfirmation")
        answer = served.client().post("/v1/webhooks/ses", content=json.dumps(message).encode())
        assert answer.status_code == 200 and answer.json()["data"] == []
        assert f"/confirm?Token={message['Token']}" in sns.gets
        wrong = sns.message(kind="SubscriptionConfirmation", topic="arn:aws:sns:eu-west-1:1:not-ours")
        refused = served.client().post("/v1/webhooks/ses", content=json.dumps(wrong).encode())
        assert refused.status_code == 403 and refused.json()["error"]["context"]["reason"] == "wrong_topic"
        assert f"/confirm?Token={wrong['Token']}" not in sns.gets


@pytest.mark.parametrize("make", CASES, ids=lambda make: make.__name__.removesuffix("_case"))
def test_a_signed_event_about_another_providers_step_is_kept_unmatched_and_closes_nothing(db_url, sns, make):
    """Each webhook's events are about its own messages only: a correctly signed event carrying
    the key of a step another provider sent (an smtp step with no relay; an http step for SES)
    is stored unmatched, and the step stays unknown."""
    case = make(sns)
    settings = {k: v for k, v in case.settings.items() if k != "smtp_relay"}
    step = make_unknown(db_url, "smtp" if case.step_provider != "smtp" else "http")
    with serving(db_url, **settings) as served:
        answer = post(served.client(), case.name, case.sign(step))
        assert answer.status_code == 200, answer.text
        [entry] = answer.json()["data"]
        assert (entry["matched"], entry["step"], entry["closed"]) == (False, None, False)
    assert step_row(db_url, step.id)["status"] == "unknown"
    assert "delivery_event" not in evidence_kinds(db_url, step.id)
    [kept] = rows(db_url, "SELECT step_id, detail FROM delivery_events")
    assert kept["step_id"] is None and kept["detail"]["not_matched"]["step"] == step.id


def test_a_lone_surrogate_before_the_signature_check_is_malformed_not_a_crash(db_url, sns, capfd):
    """JSON can spell a lone surrogate (\\ud800), UTF-8 cannot: in Mailgun's token or an SNS
    Message it is refused 400 malformed before anything is verified or fetched, no traceback."""
    settings = {"webhook_mailgun_signing_key": hooks.MAILGUN_KEY, **sns.settings()}
    with serving(db_url, **settings) as served:
        client = served.client()
        signed = {"timestamp": str(hooks.now_unix()), "token": "\ud800", "signature": "0" * 64}
        body = json.dumps({"signature": signed, "event-data": {"event": "delivered"}}).encode()
        assert b"\\ud800" in body
        mailgun = client.post("/v1/webhooks/mailgun", content=body)
        assert mailgun.status_code == 400, mailgun.text
        assert mailgun.json()["error"]["context"]["reason"] == "malformed"
        message = sns.message(hooks.ses_event("Delivery"))
        message["Message"] = "\ud800"
        fetched = len(sns.gets)
        ses = client.post("/v1/webhooks/ses", content=json.dumps(message).encode())
        assert ses.status_code == 400, ses.text
        assert ses.json()["error"]["context"]["reason"] == "malformed"
        assert len(sns.gets) == fetched
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "UnicodeEncodeError" not in out + err


def test_a_nul_or_lone_surrogate_in_signed_text_is_stripped_and_the_batch_stored(db_url):
    """A recipient's MTA may put a NUL in a bounce reason SendGrid signs; PostgreSQL's text and
    jsonb refuse NUL. The event is stored without it, and so is the event after it."""
    key = hooks.SendGridKey()
    step = make_unknown(db_url)
    events = [
        {
            "event": "bounce",
            "type": "bounce",
            "sg_event_id": "sg-nul\u0000",
            "email": "gone\u0000@example.com",
            "timestamp": hooks.now_unix(),
            "reason": "550 5.1.1 no such user\u0000 \ud800here",
            "smtp-id": step.message_id,
        },
        {"event": "delivered", "sg_event_id": "sg-after", "timestamp": hooks.now_unix(), "smtp-id": "<x@y.z>"},
    ]
    headers, body = key.sign(events)
    with serving(db_url, webhook_sendgrid_public_key=key.public, smtp_relay="sendgrid") as served:
        answer = served.client().post("/v1/webhooks/sendgrid", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert [d["event_id"] for d in answer.json()["data"]] == ["sg-nul", "sg-after"]
    stored = rows(db_url, "SELECT event_id, step_id, recipient, detail FROM delivery_events ORDER BY id")
    assert [(r["event_id"], r["step_id"]) for r in stored] == [("sg-nul", step.id), ("sg-after", None)]
    assert stored[0]["recipient"] == "gone@example.com"
    assert stored[0]["detail"]["reason"] == "550 5.1.1 no such user here"


def test_guessing_webhook_credentials_is_throttled_per_address(db_url):
    """Postmark's credentials are a password: wrong guesses count against the client's address
    as wrong API keys do (EVQ_SERVE_AUTH_FAILURES), then even the right one is 429 for a while."""
    step = make_unknown(db_url)
    record = {
        "RecordType": "Delivery",
        "MessageID": "pm-t",
        "Metadata": {"evq_key": key_tag(step.idempotency_key, step.message_id)},
    }
    settings = {
        "webhook_postmark_user": hooks.POSTMARK_USER,
        "webhook_postmark_password": hooks.POSTMARK_PASSWORD,
        "smtp_relay": "postmark",
        "serve_auth_failures": 3,
    }
    with serving(db_url, **settings) as served:
        client = served.client()
        for n in range(3):
            headers, body = hooks.postmark(record, password=f"a-guessed-password-{n:04d}")
            assert client.post("/v1/webhooks/postmark", content=body, headers=headers).status_code == 401
        headers, body = hooks.postmark(record)
        throttled = client.post("/v1/webhooks/postmark", content=body, headers=headers)
        assert throttled.status_code == 429, throttled.text
        assert int(throttled.headers["retry-after"]) >= 1
        assert throttled.json()["error"]["context"] == {"provider": "postmark", "reason": "throttled"}
        assert refused_count(served.url, "postmark", "throttled") == 1
        # Counted apart from API keys: the same address's good key still reads.
        operator = make_key(db_url, "root-t", "admin", created_by=None)
        assert served.client(operator).get("/v1/deliveries").status_code == 200
    assert step_row(db_url, step.id)["status"] == "unknown"
