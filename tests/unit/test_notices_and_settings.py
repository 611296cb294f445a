"""Notices, HTTP and reconciler settings, and the HTTP wire format: the parts without I/O."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from evq.adapters.http import retry_after, wire_body
from evq.ops.settings import Settings
from evq.worker.delivery import key_tag
from evq.worker.errors import ConfigError, InvalidRequest
from evq.worker.notices import NoticeConfig, build_notice, reserved_sender
from evq.worker.ports import SendRequest
from evq.worker.request import MAX_SUBJECT, parse
from evq.worker.states import Status

ORIGINAL = {
    "id": 42,
    "run_id": "run-1",
    "step_id": "s" * 200,
    "idempotency_key": "run-1:" + "s" * 200,
    "message_id": "<evq.1@example.org>",
    "provider": "http",
    "status": "rejected",
    "reason": "policy_refused",
    "detail": "recipient domain example.com is blocked",
    "attempts": 1,
    "notify": "me@example.net",
    "payload": parse(
        {
            "run_id": "r",
            "step_id": "s",
            "from": "Ag <agent@example.org>",
            "to": ["a@example.com"],
            "bcc": ["b@example.com"],
            "subject": "S" * MAX_SUBJECT,
            "text": "x",
        }
    ).payload,
}


def test_notice_config():
    default = NoticeConfig()
    assert default.statuses == (Status.REJECTED,) and not default.due([Status.ACCEPTED, Status.UNKNOWN])
    assert default.due([Status.ACCEPTED, Status.REJECTED])
    assert NoticeConfig(on_unknown=True).due([Status.UNKNOWN])
    assert default.sender_for("agent@mail.example.org") == "evq-notices@mail.example.org"
    assert NoticeConfig(sender="pm@example.org").sender_for("agent@x.example") == "pm@example.org"
    assert reserved_sender(None) == "evq-notices@" and reserved_sender("pm@example.org") == "pm@example.org"


def test_a_notice_fits_however_long_the_original():
    notice = build_notice(ORIGINAL, NoticeConfig())
    assert len(notice.payload["subject"]) == MAX_SUBJECT and notice.payload["subject"].startswith("[delivery failed] S")
    assert notice.step_id == "evq:notice:rejected:" + "s" * 200 and notice.notify is None
    assert notice.idempotency_key == "evq:notice:rejected:run-1:" + "s" * 200
    text = notice.payload["text"]
    # Bcc recipients by their number only: the notice's reader is whoever notify named.
    assert "a@example.com" in text and "Bcc:         1 recipient, not listed" in text and "b@example.com" not in text
    assert "recipient domain example.com is blocked" in text and "evq's own policy" in text


@pytest.mark.parametrize(
    ("status", "reason", "advice"),
    [
        ("rejected", "provider_rejected", "refused this message for good"),
        ("rejected", "late_answer", "refused this message for good"),
        ("rejected", "attempts_exhausted", "failed temporarily on every attempt"),
        ("rejected", "operator", "An operator checked this send"),
        ("rejected", "something_new", "fix the cause"),
        ("unknown", "ambiguous_response", "do not send it again yourself"),
    ],
)
def test_each_kind_of_reason_says_what_to_do(status, reason, advice):
    text = build_notice({**ORIGINAL, "status": status, "reason": reason}, NoticeConfig()).payload["text"]
    assert advice in " ".join(text.split())


def test_http_settings_are_validated():
    base = dict(adapter=("http",), http_api_key="k", lease_seconds=60, http_timeout=10)
    assert Settings(**base).validate() is None
    for bad, field in (
        (dict(http_api_key=None), "EVQ_HTTP_API_KEY"),
        (dict(http_base_url="ftp://x"), "EVQ_HTTP_BASE_URL"),
        (dict(http_timeout=30), "EVQ_LEASE_SECONDS"),
        (dict(notice_from="not an address"), "EVQ_NOTICE_FROM"),
    ):
        with pytest.raises(ConfigError) as err:
            Settings(**{**base, **bad}).validate()
        assert field in err.value.message
    # Without the http adapter its settings do not matter.
    assert Settings(adapter=("smtp",), http_api_key=None).validate() is None


def test_settings_from_the_environment():
    s = Settings.load(
        {
            "EVQ_ADAPTER": "smtp,http",
            "EVQ_HTTP_API_KEY": "secret-key-1",
            "EVQ_NOTICE_FROM": "pm@example.org",
            "EVQ_HTTP_DEDUPE_WINDOW": "900",
        },
        # A documented constant (docs/settings.md): a Python caller's to turn.
        notice_on_unknown="yes",
    )
    assert s.adapter == ("smtp", "http") and s.notice_on_unknown and s.http_dedupe_window == 900
    assert s.notices() == NoticeConfig(sender="pm@example.org", on_unknown=True)
    assert s.policy().reserved_senders == ("pm@example.org",) and "http" in s.policy().providers
    assert "secret-key-1" in s.secrets() and s.as_public_dict()["http_api_key"] == "***"
    with pytest.raises(ConfigError):
        Settings.load({}, notice_on_unknown="maybe")


def test_retry_after_reads_seconds_and_dates():
    now = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert retry_after("30") == 30 and retry_after(None) is None and retry_after("soon") is None
    assert retry_after("Tue, 01 Jan 2030 12:01:00 GMT", now=now) == 60
    assert retry_after("Tue, 01 Jan 2030 11:00:00 GMT", now=now) == 0


def test_the_wire_body_is_the_same_on_every_attempt():
    payload = parse(
        {
            "run_id": "r",
            "step_id": "s",
            "from": 'A "q" <a@example.org>',
            "to": ["b@example.com"],
            "reply_to": ["c@example.com"],
            "subject": "S",
            "text": "t",
            "html": "<p>h</p>",
            "headers": {"in-reply-to": "<x@y>"},
        }
    ).payload
    bodies = {wire_body(SendRequest(1, "r", "r:s", "<m@x>", attempt, payload)) for attempt in (1, 2, 3)}
    [body] = bodies
    data = json.loads(body)
    assert data["from"] == '"A \\"q\\"" <a@example.org>' and data["reply_to"] == ["c@example.com"]
    assert data["headers"] == {"In-Reply-To": "<x@y>", "X-Evq-Message-Id": "<m@x>"}  # never the key
    assert data["tags"][0] == {"name": "evq_key", "value": key_tag("r:s", "<m@x>")}  # never the key


def test_a_partial_refusal_owes_a_notice_naming_each_refused_recipient():
    assert NoticeConfig().due([Status.ACCEPTED], ["partially_refused"])
    assert not NoticeConfig().due([Status.ACCEPTED], ["provider_accepted"])
    original = {
        **ORIGINAL,
        "status": "accepted",
        "reason": "partially_refused",
        "detail": "accepted, but ...",
        "refused": {
            "a@example.com": {"code": 550, "reply": "5.1.1 <a@example.com>: no such user"},
            "B@example.com": {"code": 550, "reply": "5.1.1 <b@example.com>: no such user"},
        },
    }
    notice = build_notice(original, NoticeConfig())
    assert notice.step_id.startswith("evq:notice:partially_refused:")
    assert notice.idempotency_key.startswith("evq:notice:partially_refused:run-1:")
    assert notice.payload["subject"].startswith("[delivery failed for some recipients] S")
    text = notice.payload["text"]
    assert "2 of 2 refused it" in text and "a@example.com: 550 5.1.1 <a@example.com>: no such user" in text
    # The Bcc recipient is never named, not even inside the server's reply.
    assert (
        "a Bcc recipient: 550 5.1.1 <(a Bcc recipient)>: no such user" in text and "b@example.com" not in text.lower()
    )
    assert "Bcc:         1 recipient, not listed" in text
    assert "do not send it to them again" in " ".join(text.split())


def test_smtp_settings_are_validated(tmp_path):
    base = {"EVQ_SMTP_TLS": "starttls"}
    assert Settings.load({**base, "EVQ_SMTP_HELO_NAME": "mx-1.corp.example"}).smtp_helo_name == "mx-1.corp.example"
    assert Settings.load({**base, "EVQ_SMTP_HELO_NAME": "[IPv6:2001:db8::1]"}).smtp_helo_name == "[IPv6:2001:db8::1]"
    for bad in ("localhost", "two words.example", "a..b", "[not-an-ip]"):
        with pytest.raises(ConfigError, match="EVQ_SMTP_HELO_NAME"):
            Settings.load({**base, "EVQ_SMTP_HELO_NAME": bad})
    with pytest.raises(ConfigError, match=r"EVQ_SMTP_CA_FILE.*no readable file"):
        Settings.load({**base, "EVQ_SMTP_CA_FILE": str(tmp_path / "missing.pem")})
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"EVQ_SMTP_CA_FILE.*cannot be loaded"):
        Settings.load({**base, "EVQ_SMTP_CA_FILE": str(tmp_path / "junk.pem")})
    with pytest.raises(ConfigError, match="EVQ_SMTP_CLIENT_CERT"):
        Settings.load(base, smtp_client_cert=str(tmp_path / "junk.pem"))  # a documented constant
    with pytest.raises(ConfigError, match=r"EVQ_SMTP_CLIENT_KEY.*needs EVQ_SMTP_CLIENT_CERT"):
        Settings.load(base, smtp_client_key=str(tmp_path / "junk.pem"))
    plain = {"EVQ_SMTP_USERNAME": "u", "EVQ_SMTP_PASSWORD": "p"}
    with pytest.raises(ConfigError, match="without TLS"):
        Settings.load(plain)
    assert Settings.load({**plain, "EVQ_SMTP_ALLOW_PLAIN_AUTH": "true"}).smtp_allow_plain_auth
    assert Settings.load({**plain, **base}).smtp_username == "u"


def test_internal_domains_open_only_the_named_special_use_domains():
    request = {"run_id": "r", "step_id": "s", "from": "agent@example.org", "subject": "s", "text": "t"}
    settings = Settings.load({"EVQ_INTERNAL_DOMAINS": "corp.local, .Mail.Test"})
    assert settings.internal_domains == ("corp.local", ".mail.test")
    policy = settings.policy()
    to = parse({**request, "to": ["A <a@hr.corp.local>", "b@MAIL.test"], "notify": "n@mail.test"}, policy)
    assert [a["email"] for a in to.payload["to"]] == ["a@hr.corp.local", "b@mail.test"]
    for refused in ("x@corp.test", "x@local", "x@localhost", "x@evilcorp.local", "x@notmail.test", "x@..mail.test"):
        with pytest.raises(InvalidRequest):
            parse({**request, "to": [refused]}, policy)
    with pytest.raises(InvalidRequest, match="special-use"):
        parse({**request, "to": ["a@hr.corp.local"]})  # the default policy names none
    assert settings.notices().internal_domains == settings.internal_domains
    assert Settings.load({"EVQ_INTERNAL_DOMAINS": "mail.test", "EVQ_NOTICE_FROM": "evq@mail.test"}).notice_from


def test_require_provenance_reaches_the_policy_and_refuses_unknown_fields():
    settings = Settings.load({"EVQ_REQUIRE_PROVENANCE": "Model, instruction_version"})
    assert settings.policy().require_provenance == ("model", "instruction_version")
    with pytest.raises(ConfigError) as caught:
        Settings.load({"EVQ_REQUIRE_PROVENANCE": "model,modle"})
    assert "EVQ_REQUIRE_PROVENANCE" in str(caught.value) and "modle" in str(caught.value)
