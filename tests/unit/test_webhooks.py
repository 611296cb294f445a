"""Each provider's webhook receiver (adapters/webhooks/) against requests signed for real
(tests/providerhooks.py): a valid one is read into evq's DeliveryEvents; an unsigned, badly
signed, tampered or replayed one, a wrong topic or a certificate on a foreign host is refused
with its reason. The route around them is tests/web/test_webhooks.py."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from evq.adapters.webhooks import receivers
from evq.adapters.webhooks.config import WebhookConfig
from evq.ops.option_catalogue import CONSTANTS
from evq.ops.settings import Settings
from evq.worker.delivery import key_digest
from evq.worker.errors import ConfigError
from evq.worker.ports.webhooks import WebhookRefused
from tests import providerhooks as hooks
from tests.support import wait_until

DIGEST = key_digest("run-1/step-1")
MID = "<abc.123@evq.example.org>"


def receive(provider: str, config: WebhookConfig, headers: dict, body: bytes, query: dict | None = None, now=None):
    receiver = receivers(config)[provider]
    return receiver({k.lower(): v for k, v in headers.items()}, body, query or {}, now or datetime.now(UTC))


def refused(reason: str, provider: str, config: WebhookConfig, headers: dict, body: bytes, **kw) -> WebhookRefused:
    with pytest.raises(WebhookRefused) as caught:
        receive(provider, config, headers, body, **kw)
    assert caught.value.reason == reason, caught.value
    assert 400 <= caught.value.status < 600
    return caught.value


# Resend (Svix) ------------------------------------------------------------------------------

RESEND = WebhookConfig(resend_secret=hooks.RESEND_SECRET)


def resend_event(kind: str = "email.delivered", **data):
    return {
        "type": kind,
        "created_at": "2026-12-01T10:00:00.000Z",
        "data": {
            "email_id": "re_123",
            "to": ["user@example.com"],
            "tags": {"evq_key": DIGEST},
            "headers": [{"name": "X-Evq-Message-Id", "value": MID}],
            **data,
        },
    }


def test_resend_signed_by_svix_is_read():
    headers, body = hooks.resend(resend_event(), msg_id="msg_1")
    [event] = receive("resend", RESEND, headers, body)
    assert (event.provider, event.event_id, event.type) == ("resend", "msg_1", "delivered")
    assert (event.key_digest, event.message_id, event.provider_message_id) == (DIGEST, MID, "re_123")
    assert event.recipient == "user@example.com" and event.occurred_at == datetime(2026, 12, 1, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "bounce", "expected"),
    [
        ("email.bounced", {"type": "Permanent"}, "bounced_hard"),
        ("email.bounced", {"type": "Transient"}, "bounced_soft"),
        ("email.delivery_delayed", None, "deferred"),
        ("email.complained", None, "complained"),
        ("email.opened", None, "opened"),
        ("email.clicked", None, "clicked"),
    ],
)
def test_resend_event_types(kind, bounce, expected):
    headers, body = hooks.resend(resend_event(kind, **({"bounce": bounce} if bounce else {})))
    assert [e.type for e in receive("resend", RESEND, headers, body)] == [expected]


def test_resend_events_that_say_nothing_of_delivery_are_ignored():
    headers, body = hooks.resend(resend_event("email.sent"))
    assert receive("resend", RESEND, headers, body) == []


def test_resend_refusals():
    headers, body = hooks.resend(resend_event())
    refused("unsigned", "resend", RESEND, {}, body)
    refused("unsigned", "resend", RESEND, {k: v for k, v in headers.items() if k != "svix-signature"}, body)
    other = "whsec_" + "b3RoZXItc2VjcmV0LW5vdC10aGUtcmlnaHQtb25l"
    forged, _ = hooks.resend(resend_event(), secret=other, msg_id=headers["svix-id"], at=int(headers["svix-timestamp"]))
    refused("bad_signature", "resend", RESEND, forged, body)
    refused("bad_signature", "resend", RESEND, {**headers, "svix-signature": "v1,not base64!"}, body)
    refused("bad_signature", "resend", RESEND, headers, body.replace(b"delivered", b"bounced"))
    old_headers, old_body = hooks.resend(resend_event(), at=hooks.now_unix() - 600)
    refused("replayed", "resend", RESEND, old_headers, old_body)


# SendGrid (ECDSA) ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sendgrid_key():
    return hooks.SendGridKey()


def sendgrid_events():
    base = {"email": "user@example.com", "timestamp": 1764583200, "smtp-id": MID, "evq_key": DIGEST}
    return [
        {**base, "event": "processed", "sg_event_id": "e0"},
        {**base, "event": "delivered", "sg_event_id": "e1", "sg_message_id": "sg.1"},
        {**base, "event": "bounce", "type": "bounce", "sg_event_id": "e2", "reason": "550 5.1.1 no such user"},
        {**base, "event": "bounce", "type": "blocked", "sg_event_id": "e3"},
        {**base, "event": "dropped", "sg_event_id": "e4", "reason": "Bounced Address"},
        {**base, "event": "deferred", "sg_event_id": "e5"},
        {**base, "event": "spamreport", "sg_event_id": "e6"},
        {**base, "event": "open", "sg_event_id": "e7"},
        {**base, "event": "click", "sg_event_id": "e8"},
    ]


def test_sendgrid_signed_batch_is_read_with_hard_and_soft_bounces_told_apart(sendgrid_key):
    config = WebhookConfig(sendgrid_public_key=sendgrid_key.public)
    headers, body = sendgrid_key.sign(sendgrid_events())
    events = receive("sendgrid", config, headers, body)
    assert [(e.event_id, e.type) for e in events] == [
        ("e1", "delivered"),
        ("e2", "bounced_hard"),
        ("e3", "bounced_soft"),
        ("e4", "bounced_hard"),
        ("e5", "deferred"),
        ("e6", "complained"),
        ("e7", "opened"),
        ("e8", "clicked"),
    ]
    assert {(e.key_digest, e.message_id) for e in events} == {(DIGEST, MID)}
    assert events[0].provider_message_id == "sg.1" and events[1].detail["reason"] == "550 5.1.1 no such user"


def test_sendgrid_refusals(sendgrid_key):
    config = WebhookConfig(sendgrid_public_key=sendgrid_key.public)
    headers, body = sendgrid_key.sign(sendgrid_events())
    refused("unsigned", "sendgrid", config, {}, body)
    forged, _ = hooks.SendGridKey().sign(sendgrid_events(), at=int(headers["x-twilio-email-event-webhook-timestamp"]))
    refused("bad_signature", "sendgrid", config, {**forged}, body)
    refused("bad_signature", "sendgrid", config, headers, body.replace(b'"e1"', b'"e9"'))
    stamp = "x-twilio-email-event-webhook-timestamp"
    refused("bad_signature", "sendgrid", config, {**headers, stamp: str(int(headers[stamp]) + 1)}, body)
    old_headers, old_body = sendgrid_key.sign(sendgrid_events(), at=hooks.now_unix() - 3600)
    refused("replayed", "sendgrid", config, old_headers, old_body)
    not_a_batch_headers, not_a_batch = sendgrid_key.sign({"event": "delivered"})  # type: ignore[arg-type]
    refused("malformed", "sendgrid", config, not_a_batch_headers, not_a_batch)


# Postmark (basic auth or token) -------------------------------------------------------------

POSTMARK = WebhookConfig(
    postmark_user=hooks.POSTMARK_USER, postmark_password=hooks.POSTMARK_PASSWORD, postmark_token="t" * 32
)


def postmark_record(kind: str = "Delivery", **fields):
    return {
        "RecordType": kind,
        "MessageID": "pm-1",
        "Recipient": "user@example.com",
        "DeliveredAt": "2026-12-01T10:00:00Z",
        "Metadata": {"evq_key": DIGEST},
        **fields,
    }


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (postmark_record(), "delivered"),
        (postmark_record("Bounce", ID=42, Type="HardBounce"), "bounced_hard"),
        (postmark_record("Bounce", ID=43, Type="SoftBounce"), "bounced_soft"),
        (postmark_record("Bounce", ID=44, Type="Transient", Inactive=True), "bounced_hard"),
        (postmark_record("Bounce", ID=45, Type="SpamComplaint"), "complained"),
        (postmark_record("SpamComplaint", ID=46, Type="SpamComplaint"), "complained"),
        (postmark_record("Open"), "opened"),
        (postmark_record("Click"), "clicked"),
    ],
)
def test_postmark_with_basic_auth_is_read(record, expected):
    [event] = receive("postmark", POSTMARK, *hooks.postmark(record))
    assert (event.type, event.key_digest, event.provider_message_id) == (expected, DIGEST, "pm-1")
    if "ID" in record:
        assert event.event_id == f"{record['RecordType'].lower()}:{record['ID']}"


def test_postmark_ids_are_derived_deterministically_and_the_token_works_too():
    _, body = hooks.postmark(postmark_record())
    one = receive("postmark", POSTMARK, {}, body, query={"token": "t" * 32})
    two = receive("postmark", POSTMARK, {}, body, query={"token": "t" * 32})
    assert one[0].event_id == two[0].event_id and one[0].event_id.startswith("postmark:")
    assert receive("postmark", POSTMARK, *hooks.postmark(postmark_record("Bounce", ID=1, Type="AutoResponder"))) == []


def test_postmark_refusals():
    _, body = hooks.postmark(postmark_record())
    refused("unsigned", "postmark", POSTMARK, {}, body)
    refused("bad_signature", "postmark", POSTMARK, *hooks.postmark(postmark_record(), password="wrong-password-0123"))
    refused("bad_signature", "postmark", POSTMARK, *hooks.postmark(postmark_record(), user="someone-else"))
    refused("bad_signature", "postmark", POSTMARK, {"authorization": "Basic %%%"}, body)
    refused("bad_signature", "postmark", POSTMARK, {}, body, query={"token": "u" * 32})
    # A token is not accepted where only basic auth is configured.
    basic_only = replace(POSTMARK, postmark_token=None)
    refused("bad_signature", "postmark", basic_only, {}, body, query={"token": "t" * 32})
    refused("malformed", "postmark", POSTMARK, hooks.postmark({})[0], b"[1, 2]")


# Mailgun (HMAC) -----------------------------------------------------------------------------

MAILGUN = WebhookConfig(mailgun_signing_key=hooks.MAILGUN_KEY)


def mailgun_event(kind: str = "delivered", **fields):
    return {
        "id": "mg-ev-1",
        "event": kind,
        "timestamp": 1764583200.5,
        "recipient": "user@example.com",
        "user-variables": {"evq_key": DIGEST},
        "message": {"headers": {"message-id": MID.strip("<>")}},
        **fields,
    }


def test_mailgun_signed_event_is_read_and_its_message_id_gets_its_brackets_back():
    [event] = receive("mailgun", MAILGUN, *hooks.mailgun(mailgun_event()))
    assert (event.event_id, event.type, event.key_digest, event.message_id) == ("mg-ev-1", "delivered", DIGEST, MID)
    [hard] = receive("mailgun", MAILGUN, *hooks.mailgun(mailgun_event("failed", severity="permanent")))
    [soft] = receive("mailgun", MAILGUN, *hooks.mailgun(mailgun_event("failed", severity="temporary")))
    assert (hard.type, soft.type) == ("bounced_hard", "bounced_soft")
    assert receive("mailgun", MAILGUN, *hooks.mailgun(mailgun_event("accepted"))) == []


def test_mailgun_refusals():
    _, body = hooks.mailgun(mailgun_event())
    refused("unsigned", "mailgun", MAILGUN, {}, json.dumps({"event-data": mailgun_event()}).encode())
    refused("bad_signature", "mailgun", MAILGUN, *hooks.mailgun(mailgun_event(), key="another-signing-key-0123456789"))
    doc = json.loads(body)
    doc["signature"]["timestamp"] = str(int(doc["signature"]["timestamp"]) - 1)
    refused("bad_signature", "mailgun", MAILGUN, {}, json.dumps(doc).encode())
    refused("replayed", "mailgun", MAILGUN, *hooks.mailgun(mailgun_event(), at=hooks.now_unix() - 600))


def test_mailgun_token_reused_for_other_event_data_is_refused():
    """Mailgun signs only timestamp and token: the same signature over other event-data is a forgery."""
    receiver = receivers(MAILGUN)["mailgun"]
    headers, body = hooks.mailgun(mailgun_event())
    assert receiver(headers, body, {}, datetime.now(UTC))
    assert receiver(headers, body, {}, datetime.now(UTC))  # the same bytes again: the same event (deduped)
    doc = json.loads(body)
    doc["event-data"]["event"] = "complained"
    with pytest.raises(WebhookRefused) as caught:
        receiver(headers, json.dumps(doc).encode(), {}, datetime.now(UTC))
    assert caught.value.reason == "replayed"


# SES through SNS ----------------------------------------------------------------------------


def ses_config(sns) -> WebhookConfig:
    return WebhookConfig(**{k.removeprefix("webhook_"): v for k, v in sns.settings().items()})


@pytest.mark.parametrize("version", ["1", "2"])
def test_ses_notification_signed_by_sns_is_read(sns, version):
    receiver = receivers(ses_config(sns))["ses"]
    message = sns.message(hooks.ses_event("Delivery", key_digest=DIGEST, message_id=MID), version=version)
    [event] = receiver({}, json.dumps(message).encode(), {}, datetime.now(UTC))
    assert (event.provider, event.event_id, event.type) == ("ses", message["MessageId"], "delivered")
    assert (event.key_digest, event.message_id, event.recipient) == (DIGEST, MID, "user@example.com")
    # The certificate is fetched once and cached.
    again = sns.message(hooks.ses_event("Bounce", key_digest=DIGEST), version=version)
    [bounce] = receiver({}, json.dumps(again).encode(), {}, datetime.now(UTC))
    assert bounce.type == "bounced_hard" and sns.gets == [sns.CERT]


@pytest.mark.parametrize(
    ("kind", "section", "expected"),
    [
        ("Bounce", {"bounceType": "Transient"}, "bounced_soft"),
        ("Bounce", {"bounceType": "Undetermined"}, "bounced_soft"),
        ("Complaint", {}, "complained"),
        ("DeliveryDelay", {}, "deferred"),
    ],
)
def test_ses_event_types(sns, kind, section, expected):
    message = sns.message(hooks.ses_event(kind, key_digest=DIGEST, **section))
    assert [e.type for e in receive("ses", ses_config(sns), {}, json.dumps(message).encode())] == [expected]


def test_ses_identity_notifications_with_notification_type_are_read(sns):
    event = hooks.ses_event("Delivery", key_digest=DIGEST)
    event["notificationType"] = event.pop("eventType")
    [read] = receive("ses", ses_config(sns), {}, json.dumps(sns.message(event)).encode())
    assert read.type == "delivered"


def test_ses_subscription_is_verified_then_confirmed_at_its_url(sns):
    message = sns.message(kind="SubscriptionConfirmation")
    assert receive("ses", ses_config(sns), {}, json.dumps(message).encode()) == []
    assert sns.gets == [sns.CERT, f"/confirm?Token={message['Token']}"]


def test_ses_refusals(sns):
    config = ses_config(sns)
    good = sns.message(hooks.ses_event("Delivery", key_digest=DIGEST))

    def body(message):
        return json.dumps(message).encode()

    refused("unsigned", "ses", config, {}, body({k: v for k, v in good.items() if k != "Signature"}))
    tampered = {**good, "Message": good["Message"].replace("Delivery", "Bounce")}
    refused("bad_signature", "ses", config, {}, body(tampered))
    # Signed by another key than the certificate's.
    forger = hooks.Sns.__new__(hooks.Sns)
    forger.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    refused("bad_signature", "ses", config, {}, body(forger.sign({k: v for k, v in good.items() if k != "Signature"})))
    # Checked before anything is fetched: the topic, then the certificate's host and scheme.
    fetched = len(sns.gets)
    refused(
        "wrong_topic", "ses", config, {}, body(sns.message(hooks.ses_event(), topic="arn:aws:sns:eu-west-1:1:other"))
    )
    for url in (
        "https://evil.example.com" + sns.CERT,
        sns.url.replace("https", "http") + sns.CERT,
        sns.CERT,
        sns.url + "/cert.pem",  # on the host, but not where SNS keeps its certificates
        sns.url + sns.CERT + "?x=1",
    ):
        refused("foreign_cert", "ses", config, {}, body(sns.message(hooks.ses_event(), cert_url=url)))
    subscribe = sns.message(kind="SubscriptionConfirmation", SubscribeURL="https://evil.example.com/x")
    refused("foreign_cert", "ses", config, {}, body(subscribe))
    assert len(sns.gets) == fetched
    old = sns.message(hooks.ses_event(), at=datetime.now(UTC) - timedelta(hours=2))
    refused("replayed", "ses", config, {}, body(old))
    gone = refused(
        "cert_unavailable",
        "ses",
        config,
        {},
        body(sns.message(hooks.ses_event(), cert_url=sns.url + "/SimpleNotificationService-0.pem")),
    )
    assert gone.status == 503
    refused("malformed", "ses", config, {}, b"not json")


def test_the_default_sns_host_pattern_takes_only_sns_hosts():
    from evq.adapters.webhooks.ses import SnsReceiver

    receiver = SnsReceiver(WebhookConfig(ses_topic_arns=(hooks.TOPIC,)))
    assert receiver.sns_url("https://sns.eu-west-1.amazonaws.com/x.pem")
    assert receiver.sns_url("https://sns.cn-north-1.amazonaws.com.cn/x.pem")
    assert receiver.sns_url("https://sns.eu-west-1.amazonaws.com:443/SimpleNotificationService-ab12.pem", cert=True)
    for url in (
        "https://sns.eu-west-1.amazonaws.com:8443/x.pem",
        "https://sns.eu-west-1.amazonaws.com.evil.example/x.pem",
        "https://evil.example/sns.eu-west-1.amazonaws.com/x.pem",
        "https://user@sns.eu-west-1.amazonaws.com/x.pem",
        "http://sns.eu-west-1.amazonaws.com/x.pem",
        "https://s3.amazonaws.com/x.pem",
    ):
        with pytest.raises(WebhookRefused):
            receiver.sns_url(url)


# Settings -----------------------------------------------------------------------------------


def test_webhook_settings_are_read_and_their_secrets_registered(sendgrid_key):
    env = {
        "EVQ_WEBHOOK_RESEND_SECRET": hooks.RESEND_SECRET,
        "EVQ_WEBHOOK_SENDGRID_PUBLIC_KEY": sendgrid_key.public,
        "EVQ_WEBHOOK_MAILGUN_SIGNING_KEY": hooks.MAILGUN_KEY,
        "EVQ_WEBHOOK_SES_TOPIC_ARNS": f"{hooks.TOPIC}, arn:aws:sns:us-east-1:1:Other",
    }
    # Postmark's basic auth and the clock tolerance are documented constants: a Python caller's.
    constants = {
        "webhook_postmark_user": hooks.POSTMARK_USER,
        "webhook_postmark_password": hooks.POSTMARK_PASSWORD,
        "webhook_tolerance": "2m",
    }
    settings = Settings.load(env=env, **constants)
    config = settings.webhook_config()
    assert config.configured() == ("resend", "sendgrid", "postmark", "mailgun", "ses")
    assert config.ses_topic_arns == (hooks.TOPIC, "arn:aws:sns:us-east-1:1:Other") and config.tolerance == 120
    assert {hooks.RESEND_SECRET, hooks.POSTMARK_PASSWORD, hooks.MAILGUN_KEY} <= set(settings.secrets())
    assert Settings.load(env={}).webhook_config().configured() == ()
    assert receivers(Settings.load(env={}).webhook_config()) == {}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("EVQ_WEBHOOK_RESEND_SECRET", "whsec_***"),
        ("EVQ_WEBHOOK_SENDGRID_PUBLIC_KEY", "bm90IGEga2V5"),
        ("EVQ_WEBHOOK_MAILGUN_SIGNING_KEY", "short"),
        ("EVQ_WEBHOOK_POSTMARK_PASSWORD", "x" * 20),  # without a user
        ("EVQ_WEBHOOK_SES_TOPIC_ARNS", "my-topic"),
        ("EVQ_WEBHOOK_SNS_CERT_HOSTS", "sns(["),
    ],
)
def test_a_webhook_setting_that_could_never_verify_fails_at_start(name, value):
    field = name.removeprefix("EVQ_").lower()
    with pytest.raises(ConfigError) as caught:
        if field in CONSTANTS:  # a documented constant: a Python caller's to pass
            Settings.load(env={}, **{field: value})
        else:
            Settings.load(env={name: value})
    assert name in caught.value.message


def test_the_routes_provider_list_is_the_adapters():
    from evq.adapters.webhooks.config import PROVIDERS
    from evq.ops.web import webhooks

    assert webhooks.PROVIDERS == PROVIDERS


@pytest.mark.parametrize(
    ("relay", "expected"),
    [
        ("none", {"resend": {"http"}, "ses": {"ses"}, "sendgrid": set(), "postmark": set(), "mailgun": set()}),
        ("mailgun", {"resend": {"http"}, "ses": {"ses"}, "sendgrid": set(), "postmark": set(), "mailgun": {"smtp"}}),
        ("ses", {"resend": {"http"}, "ses": {"ses", "smtp"}, "sendgrid": set(), "postmark": set(), "mailgun": set()}),
    ],
)
def test_each_webhook_reports_only_the_step_providers_that_can_have_sent_through_it(relay, expected):
    got = replace(Settings(), smtp_relay=relay).webhook_step_providers()
    assert {hook: set(steps) for hook, steps in got.items()} == expected


def test_stored_text_loses_nuls_and_lone_surrogates_and_signed_text_with_one_is_malformed():
    from evq.adapters.webhooks.common import detail, message_id, text, utf8

    assert text("a\u0000b\ud800c") == "abc" and text("\u0000") is None
    assert message_id("<a\u0000b@example.org>") == "<ab@example.org>"
    assert detail({"reason": "x\u0000y", "n": 1}, ("reason", "n")) == {"reason": "xy", "n": 1}
    with pytest.raises(WebhookRefused) as caught:
        utf8("tok\ud800", "signature.token")
    assert (caught.value.status, caught.value.reason) == (400, "malformed")


def test_a_failed_certificate_fetch_is_remembered_and_fetches_at_once_are_bounded(sns):
    """A URL that could not be fetched is not fetched again for a while; beyond CERT_FETCHES
    fetches at once another message is refused at once (503), not left holding a thread."""
    import threading

    from evq.adapters.webhooks import ses

    receiver = receivers(ses_config(sns))["ses"]

    def post(cert: str) -> WebhookRefused:
        body = json.dumps(sns.message(hooks.ses_event(), cert_url=sns.url + cert)).encode()
        with pytest.raises(WebhookRefused) as caught:
            receiver({}, body, {}, datetime.now(UTC))
        return caught.value

    gone = "/SimpleNotificationService-dead.pem"
    assert (post(gone).status, sns.gets.count(gone)) == (503, 1)
    assert (post(gone).reason, sns.gets.count(gone)) == ("cert_unavailable", 1)  # remembered: not fetched again

    held = [f"/SimpleNotificationService-feed{i}.pem" for i in range(ses.CERT_FETCHES)]
    refusals: list[WebhookRefused] = []
    waiting = [threading.Thread(target=lambda c=c: refusals.append(post(c))) for c in held]
    for thread in waiting:
        thread.start()
    try:
        wait_until(lambda: all(c in sns.gets for c in held), what="every fetch slot to be taken")
        busy = post("/SimpleNotificationService-beef.pem")
        assert (busy.status, busy.reason) == (503, "cert_unavailable")
        assert "/SimpleNotificationService-beef.pem" not in sns.gets
    finally:
        sns.release.set()
        for thread in waiting:
            thread.join()
    assert [r.status for r in refusals] == [503] * ses.CERT_FETCHES
    # The slots are free again: the next certificate is fetched (and verifies).
    [event] = receiver({}, json.dumps(sns.message(hooks.ses_event())).encode(), {}, datetime.now(UTC))
    assert event.type == "delivered" and sns.CERT in sns.gets
