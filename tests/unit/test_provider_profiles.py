"""Provider profiles (docs/design.md, "Provider profiles"): what each adapter says can settle a
lost answer, computed from the settings alone; the enqueue rules that flag or refuse a step
whose provider could never settle one (worker/enqueue.py); and the SMTP relays' metadata
header (adapters/smtp/message.py), rendered and parsed back as the relay reads it."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email import policy as email_policy
from email.parser import BytesParser

import pytest

from evq.adapters.http.config import WEBHOOK_EVENTS as RESEND_EVENTS
from evq.adapters.smtp.config import RELAY_EVENTS, SmtpConfig
from evq.adapters.smtp.config import profile as smtp_profile
from evq.adapters.smtp.message import (
    RELAY_HEADERS,
    BuildError,
    _verify_relay_header,
    build_message,
    relay_header,
    relay_key_digest,
)
from evq.ops import wiring
from evq.ops.settings import Settings
from evq.worker.delivery import DELIVERY_TYPES, KEY_TAG, key_tag
from evq.worker.enqueue import (
    answer_held,
    existing_or_conflict,
    flag_ambiguity,
    merge_answers,
    must_look_up,
    refuse_unresolvable,
    validate,
    validate_many,
)
from evq.worker.errors import ConfigError, IdempotencyConflict, InvalidRequest, Unresolvable
from evq.worker.ports import ProviderProfile, SendRequest, profile_of
from evq.worker.records import AMBIGUITY_HINTS, EnqueueResult
from evq.worker.request import Policy, parse
from evq.worker.states import Status
from tests.support import POLICY, request

# -- each adapter's profile, from the settings --------------------------------


def test_each_adapter_says_what_settles_a_lost_answer_from_the_settings_alone():
    profiles = Settings.load(env={}).provider_profiles()
    assert set(profiles) == {"smtp", "http", "ses", "null"}
    # HTTP: the provider dedupes our key for its window and is searched by the evq_key tag.
    assert profiles["http"] == ProviderProfile(dedupe_window=86400.0, lookup_by=("key_tag",), webhook_events=())
    # Plain SMTP and the null adapter: nothing at all.
    assert profiles["smtp"] == ProviderProfile() and not profiles["smtp"].resolvable
    assert profiles["null"] == ProviderProfile() and not profiles["null"].resolvable
    # SES: no key, no lookup; its events count only with a configuration set and a verified webhook.
    assert profiles["ses"] == ProviderProfile() and not profiles["ses"].resolvable
    ses = Settings.load(env={"EVQ_SES_CONFIGURATION_SET": "evq"})
    assert not ses.provider_profiles()["ses"].resolvable
    assert ses.provider_profiles(webhooks_configured={"ses"})["ses"].webhook_events == DELIVERY_TYPES
    # SMTP with a journal mailbox (EVQ_JOURNAL_IMAP_URL): its copies are looked up by Message-ID.
    journal = {"EVQ_JOURNAL_IMAP_URL": "imaps://journal@imap.example/INBOX", "EVQ_JOURNAL_IMAP_PASSWORD": "pw"}
    witnessed = Settings.load(env=journal).provider_profiles()["smtp"]
    assert witnessed.lookup_by == ("message_id",) and witnessed.resolvable
    # A window of 0 means the provider does not dedupe; the lookup still settles a lost answer.
    no_window = Settings.load(env={"EVQ_HTTP_DEDUPE_WINDOW": "0"}).provider_profiles()["http"]
    assert no_window.dedupe_window is None and no_window.resolvable


def test_a_webhook_counts_only_once_it_is_configured_and_only_for_its_own_provider():
    settings = Settings.load(env={"EVQ_SMTP_RELAY": "sendgrid"})
    assert settings.webhooks_configured() == frozenset()  # no webhook secret set: none counts
    assert not settings.provider_profiles()["smtp"].resolvable
    assert not settings.provider_profiles(webhooks_configured={"mailgun", "resend"})["smtp"].resolvable
    hooked = settings.provider_profiles(webhooks_configured={"sendgrid", "resend"})
    assert hooked["smtp"].webhook_events == RELAY_EVENTS["sendgrid"] and hooked["smtp"].resolvable
    assert hooked["http"].webhook_events == RESEND_EVENTS
    assert wiring.provider_profiles(settings, {"sendgrid"}) == settings.provider_profiles({"sendgrid"})
    for relay, events in RELAY_EVENTS.items():
        assert set(events) <= set(DELIVERY_TYPES), relay
        assert smtp_profile(SmtpConfig(relay=relay), {relay}).webhook_events == events


def test_a_set_webhook_secret_is_what_makes_its_events_count():
    settings = Settings.load(
        env={"EVQ_SMTP_RELAY": "postmark", "EVQ_WEBHOOK_POSTMARK_TOKEN": "s3cret-token-of-postmark"}
    )
    assert settings.webhooks_configured() == {"postmark"}
    profiles = settings.provider_profiles()
    assert profiles["smtp"].webhook_events == RELAY_EVENTS["postmark"] and not profiles["http"].webhook_events
    assert settings.policy().unresolvable == ("ses", "null")
    both = replace(settings, webhook_resend_secret="whsec_" + "b3RoZXI=")
    assert both.provider_profiles()["http"].webhook_events == RESEND_EVENTS


def test_the_settings_policy_names_the_unresolvable_providers_and_the_refusal():
    assert Settings.load(env={}).policy().unresolvable == ("smtp", "ses", "null")
    assert Settings.load(env={}).policy().refuse_unresolvable is False
    assert Settings.load(env={"EVQ_REFUSE_UNRESOLVABLE": "on"}).policy().refuse_unresolvable is True
    with pytest.raises(ConfigError, match="EVQ_SMTP_RELAY"):
        Settings.load(env={"EVQ_SMTP_RELAY": "sparkpost"})


def test_the_providers_wiring_builds_declare_the_profile_the_settings_give():
    settings = Settings.load(
        env={"EVQ_ADAPTER": "smtp,http,null", "EVQ_HTTP_API_KEY": "k-123", "EVQ_SMTP_RELAY": "ses"}
    )
    providers = wiring.build_providers(settings, pepper=b"p" * 32, wire_keys_from=1)
    try:
        expected = settings.provider_profiles()
        assert {name: profile_of(p) for name, p in providers.items()} == {name: expected[name] for name in providers}
        assert providers["smtp"].relay == "ses"  # type: ignore[attr-defined]
    finally:
        asyncio.run(_close(providers))


async def _close(providers) -> None:
    for provider in providers.values():
        await provider.close()


# -- the enqueue rules ----------------------------------------------------------

UNRESOLVABLE = replace(POLICY, unresolvable=("smtp", "null"))
REFUSING = replace(UNRESOLVABLE, refuse_unresolvable=True)


def test_a_step_through_an_unresolvable_provider_is_flagged_and_with_the_setting_refused():
    ok = validate(request(provider="smtp"), UNRESOLVABLE)
    result = EnqueueResult(1, ok.run_id, ok.step_id, ok.idempotency_key, "<m@x>", Status.PENDING, True)
    flagged = flag_ambiguity(result, ok, UNRESOLVABLE).to_dict()
    assert flagged["ambiguity"] == "unresolvable" and flagged["ambiguity_hint"] == AMBIGUITY_HINTS["unresolvable"]
    through_http = validate(request(provider="http"), REFUSING)
    assert flag_ambiguity(result, through_http, REFUSING).to_dict()["ambiguity"] is None
    assert result.to_dict()["ambiguity"] is None  # what a store returns says nothing either way
    # A result naming its stored step's provider is flagged by that provider, not the request's.
    stored = replace(result, provider="smtp")
    assert flag_ambiguity(stored, through_http, REFUSING).ambiguity == "unresolvable"
    assert "provider" not in stored.to_dict()

    # validate() checks the fields; the refusal waits for the lookup (a held key is answered).
    smtp = validate(request(provider="smtp"), REFUSING)
    assert must_look_up([smtp, through_http], REFUSING) == [0] and must_look_up([smtp], UNRESOLVABLE) == []
    with pytest.raises(Unresolvable) as refused:
        answer_held([smtp], {0: None}, REFUSING)
    assert refused.value.code == "E_UNRESOLVABLE" and isinstance(refused.value, InvalidRequest)
    [field] = refused.value.context["fields"]
    assert field["field"] == "provider" and "EVQ_REFUSE_UNRESOLVABLE" in field["message"]
    assert "nothing was enqueued" in (refused.value.hint or "")
    # A ValidRequest passed through (the Python API's) is judged the same.
    with pytest.raises(Unresolvable):
        refuse_unresolvable([validate(parse(request(provider="null"), POLICY), REFUSING)], REFUSING)


def _row(req, **overrides):
    return {
        "id": 7,
        "run_id": req.run_id,
        "step_id": req.step_id,
        "idempotency_key": req.idempotency_key,
        "message_id": "<m@x>",
        "status": "pending",
        "payload_sha256": req.payload_sha256,
        "provider": req.provider,
        **overrides,
    }


def test_a_held_key_is_answered_as_its_row_is_and_only_a_new_step_is_refused():
    smtp = validate(request(provider="smtp"), REFUSING)
    new = validate(request(provider="null"), REFUSING)
    http = validate(request(provider="http"), REFUSING)
    [answer] = answer_held([smtp], {0: _row(smtp)}, REFUSING).values()
    assert (answer.id, answer.created, answer.status, answer.ambiguity) == (7, False, Status.PENDING, "unresolvable")
    # A batch: the held one answered, the new unresolvable one refused by its index.
    with pytest.raises(Unresolvable) as refused:
        answer_held([http, smtp, new], {1: _row(smtp), 2: None}, REFUSING, indexed=True)
    assert [f["field"] for f in refused.value.errors] == ["[2].provider"]
    answered = answer_held([http, smtp], {1: _row(smtp)}, REFUSING, indexed=True)
    made = EnqueueResult(9, http.run_id, http.step_id, http.idempotency_key, "<n@x>", Status.PENDING, True)
    assert [r.id for r in merge_answers(answered, [made])] == [9, 7]


def test_the_provider_is_part_of_a_steps_identity():
    http = validate(request(run_id="r", step_id="s", provider="http"), POLICY)
    with pytest.raises(IdempotencyConflict) as other:
        existing_or_conflict({**_row(http), "provider": "smtp", "created": False}, http)
    assert other.value.message.startswith("this key was enqueued through smtp;")
    assert repr(http.idempotency_key) in other.value.message and "cannot be sent through http" in other.value.message
    assert other.value.context["existing_provider"] == "smtp" and other.value.context["provider"] == "http"
    assert "new step_id" in (other.value.hint or "")
    both = {**_row(http), "provider": "smtp", "payload_sha256": "0" * 64, "created": False}
    with pytest.raises(IdempotencyConflict, match="the request differs too"):
        existing_or_conflict(both, http)
    with pytest.raises(IdempotencyConflict, match="different request"):
        existing_or_conflict({**_row(http), "payload_sha256": "0" * 64, "created": False}, http)
    # The same run and step under another key and through another provider: the generic refusal.
    with pytest.raises(IdempotencyConflict, match="different request"):
        existing_or_conflict({**_row(http), "idempotency_key": "k2", "provider": "smtp", "created": False}, http)
    same = existing_or_conflict({**_row(http), "created": False}, http)
    assert (same.id, same.created, same.provider) == (7, False, "http")


def test_field_errors_come_first_and_a_batch_names_only_its_unresolvable_requests():
    with pytest.raises(InvalidRequest) as bad:
        validate(request(provider="smtp", to=None), REFUSING)
    assert bad.value.code == "E_INVALID_ARG" and [f["field"] for f in bad.value.errors] == ["to"]

    batch = validate_many(
        [request(provider="http"), request(provider="smtp"), request(provider="http"), request(provider="null")],
        REFUSING,
    )
    assert must_look_up(batch, REFUSING) == [1, 3]
    with pytest.raises(Unresolvable) as refused:
        answer_held(batch, {1: None, 3: None}, REFUSING, indexed=True)
    assert [f["field"] for f in refused.value.errors] == ["[1].provider", "[3].provider"]
    with pytest.raises(InvalidRequest) as mixed:
        validate_many([request(provider="smtp"), request(subject=None, text=None, html=None)], REFUSING)
    assert mixed.value.code == "E_INVALID_ARG"  # the field errors of the batch, not the provider
    assert len(batch) == 4 and must_look_up(batch, UNRESOLVABLE) == []  # flagged, not refused


# -- the SMTP relays' metadata header ---------------------------------------------

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
KEY = "run-relay:step-1"
MID = "<evq.relay@example.org>"


def _send_request(attempt: int = 1) -> SendRequest:
    valid = parse(request(run_id="run-relay", step_id="step-1"), POLICY)
    return SendRequest(
        step_id=3,
        run_id=valid.run_id,
        idempotency_key=valid.idempotency_key,
        message_id=MID,
        attempt=attempt,
        payload=valid.payload,
    )


@pytest.mark.parametrize("relay", sorted(RELAY_HEADERS))
def test_the_relay_header_carries_the_key_tag_and_parses_back_as_the_relay_reads_it(relay):
    first = build_message(_send_request(1), now=NOW, relay=relay)
    later = build_message(_send_request(2), now=NOW + timedelta(hours=3), relay=relay)
    name = RELAY_HEADERS[relay]
    message = BytesParser(policy=email_policy.default).parsebytes(first.data)
    [value] = message.get_all(name)
    digest = key_tag(KEY, MID)
    assert relay_key_digest(relay, str(value)) == digest
    # The same line on every attempt: derived from the key and the Message-ID.
    line = re.search(rb"^" + re.escape(name.encode()) + rb":[^\r]*\r\n", first.data, re.M | re.I)
    assert line is not None and line[0] in later.data
    # As each relay documents it.
    if relay == "sendgrid":
        assert json.loads(str(value)) == {"unique_args": {KEY_TAG: digest}}
    elif relay == "mailgun":
        assert json.loads(str(value)) == {KEY_TAG: digest}
    elif relay == "postmark":
        assert name == "X-PM-Metadata-evq_key" and str(value) == digest and len(digest) <= 80
    else:
        assert re.fullmatch(r"evq_key=[0-9a-f]{64}-[0-9a-f]{12}", str(value))  # SES tags: letters, digits, _ and -
    # The digest, never the key (run and step ids are none of the recipients' business).
    assert KEY.encode() not in first.data
    # The other relays' headers are not there.
    assert all(message.get(other) is None for r, other in RELAY_HEADERS.items() if r != relay)


def test_no_relay_no_header_and_a_header_that_would_not_carry_the_digest_sends_nothing():
    plain = build_message(_send_request(), now=NOW)
    message = BytesParser(policy=email_policy.default).parsebytes(plain.data)
    assert all(message.get(name) is None for name in RELAY_HEADERS.values())
    assert relay_header("none", KEY, MID) is None
    with pytest.raises(BuildError, match="unknown SMTP relay"):
        build_message(_send_request(), now=NOW, relay="sparkpost")
    # The check on the bytes itself: another digest, or the header twice, is refused.
    rendered = build_message(_send_request(), now=NOW, relay="mailgun")
    with pytest.raises(BuildError, match="X-Mailgun-Variables"):
        _verify_relay_header(rendered.data, False, "mailgun", key_tag("another:key", MID))
    head, _, body = rendered.data.partition(b"\r\n\r\n")
    twice = head + b"\r\nX-Mailgun-Variables: {}\r\n\r\n" + body
    with pytest.raises(BuildError):
        _verify_relay_header(twice, False, "mailgun", key_tag(KEY, MID))


@pytest.mark.parametrize(
    ("relay", "value", "found"),
    [
        ("sendgrid", '{"unique_args": {"evq_key": "abc"}}', "abc"),
        ("sendgrid", '{"evq_key": "abc"}', None),
        ("sendgrid", "not json", None),
        ("mailgun", '{"evq_key": "abc", "other": "x"}', "abc"),
        ("mailgun", '{"evq_key": 5}', None),
        ("mailgun", '["evq_key"]', None),
        ("postmark", " abc ", "abc"),
        ("ses", "campaign=x, evq_key=abc", "abc"),
        ("ses", "evq_key", None),
        ("none", "anything", None),
    ],
)
def test_reading_a_relay_header_back(relay, value, found):
    assert relay_key_digest(relay, value) == found


def test_the_smtp_provider_refuses_an_unknown_relay():
    from evq.adapters.smtp import SmtpProvider

    with pytest.raises(ValueError, match="relay"):
        SmtpProvider(host="127.0.0.1", port=25, relay="sparkpost")
    assert profile_of(SmtpProvider(host="127.0.0.1", port=25, relay="ses")) == ProviderProfile()
    assert Policy().unresolvable == ()  # the library's default policy knows no profiles
