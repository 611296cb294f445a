"""SendGrid's Signed Event Webhook: ECDSA (P-256, SHA-256) over the
``X-Twilio-Email-Event-Webhook-Timestamp`` header's value followed by the raw body, the
signature (base64 DER) in ``X-Twilio-Email-Event-Webhook-Signature``, checked with the
verification key the dashboard shows (base64 DER), by ``cryptography``. The timestamp must
be within EVQ_WEBHOOK_TOLERANCE.

The body is a batch (a JSON array) of events. Custom arguments appear as top-level fields of
each event, so ``evq_key`` is one; ``smtp-id`` is the Message-ID; ``sg_event_id`` dedupes.
Types: ``delivered``; ``deferred``; ``bounce`` with ``type: bounce`` is a hard bounce (the
receiving server refused the address for good, and SendGrid suppresses it), with ``type:
blocked`` a soft one (a block, often temporary: reputation, content, rate; the address is
not suppressed); ``dropped`` is hard (SendGrid will not send to it at all: a suppressed,
invalid or unsubscribed address, and it never retries); ``spamreport`` complained; ``open``,
``click``. ``processed`` and the unsubscribe events are ignored.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from evq.adapters.webhooks.common import (
    MAX_EVENTS,
    bad_signature,
    check_window,
    derived_id,
    detail,
    digest,
    headers_get,
    load_json,
    malformed,
    message_id,
    text,
    unix_time,
    unsigned,
)
from evq.adapters.webhooks.config import WebhookConfig
from evq.worker.delivery import KEY_TAG, DeliveryEvent, DeliveryType

PROVIDER = "sendgrid"
SIGNATURE = "x-twilio-email-event-webhook-signature"
TIMESTAMP = "x-twilio-email-event-webhook-timestamp"
TYPES: dict[str, DeliveryType] = {
    "delivered": "delivered",
    "deferred": "deferred",
    "dropped": "bounced_hard",
    "spamreport": "complained",
    "open": "opened",
    "click": "clicked",
}
_KEPT = ("event", "type", "reason", "status", "response", "attempt", "bounce_classification")


@lru_cache(maxsize=4)
def _key(encoded: str) -> Any:
    from cryptography.hazmat.primitives.serialization import load_der_public_key

    return load_der_public_key(base64.b64decode(encoded))


def verify_and_parse(
    headers: Mapping[str, str],
    body: bytes,
    config: WebhookConfig,
    now: datetime,
    query: Mapping[str, str] | None = None,
) -> list[DeliveryEvent]:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    assert config.sendgrid_public_key
    signature, stamp = headers_get(headers, SIGNATURE), headers_get(headers, TIMESTAMP)
    if not (signature and stamp):
        raise unsigned(f"{SIGNATURE} and {TIMESTAMP} are required")
    sent_at = unix_time(stamp)
    if sent_at is None:
        raise bad_signature("the timestamp is not a time")
    try:
        raw = base64.b64decode(signature, validate=True)
        _key(config.sendgrid_public_key).verify(raw, stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, binascii.Error, ValueError):
        raise bad_signature() from None
    # After the signature: a replay is told apart from a forgery only once the bytes are SendGrid's.
    check_window(sent_at, now, config.tolerance)
    return parse(load_json(body))


def parse(payload: Any) -> list[DeliveryEvent]:
    if not isinstance(payload, list) or len(payload) > MAX_EVENTS:
        raise malformed(f"a SendGrid body is an array of at most {MAX_EVENTS} events")
    out = []
    for event in payload:
        if not isinstance(event, dict) or not isinstance(event.get("event"), str):
            raise malformed("each SendGrid event is an object with an event")
        kind = event["event"]
        if kind == "bounce":
            delivery: DeliveryType = "bounced_soft" if event.get("type") == "blocked" else "bounced_hard"
        elif kind in TYPES:
            delivery = TYPES[kind]
        else:
            continue
        event_id = text(event.get("sg_event_id"), 200) or derived_id(
            PROVIDER, kind, event.get("sg_message_id"), event.get("email"), event.get("timestamp")
        )
        out.append(
            DeliveryEvent(
                provider=PROVIDER,
                event_id=event_id,
                type=delivery,
                occurred_at=unix_time(event.get("timestamp")),
                key_digest=digest(event.get(KEY_TAG)),
                message_id=message_id(event.get("smtp-id")),
                provider_message_id=text(event.get("sg_message_id"), 200),
                recipient=text(event.get("email")),
                detail=detail(event, _KEPT),
            )
        )
    return out
