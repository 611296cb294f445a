"""Resend's webhooks: Svix-signed (``svix-id``, ``svix-timestamp``, ``svix-signature``:
HMAC-SHA256 of ``id.timestamp.body`` under the endpoint's ``whsec_`` secret), verified by the
``svix`` library itself with its 5-minute timestamp tolerance.

Events: ``email.delivered``, ``email.delivery_delayed``, ``email.bounced`` (``bounce.type``
Permanent: hard; Transient: soft), ``email.complained``, ``email.opened``, ``email.clicked``;
the others (``email.sent``, ``email.scheduled``, contact and domain events) say nothing a
step needs and are ignored. Matched by the ``evq_key`` tag (adapters/http/ sends it) and by
our Message-ID when the event echoes headers. Dedupe: ``svix-id``, the same on each retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from evq.adapters.webhooks.common import (
    bad_signature,
    check_window,
    detail,
    digest,
    headers_get,
    iso_time,
    load_json,
    malformed,
    message_id,
    replayed,
    text,
    unix_time,
    unsigned,
)
from evq.adapters.webhooks.config import WebhookConfig
from evq.worker.delivery import KEY_TAG, DeliveryEvent, DeliveryType

PROVIDER = "resend"
TOLERANCE = 300.0  # svix's own, fixed
TYPES: dict[str, DeliveryType] = {
    "email.delivered": "delivered",
    "email.delivery_delayed": "deferred",
    "email.complained": "complained",
    "email.opened": "opened",
    "email.clicked": "clicked",
}
# The header evq may set so a provider that echoes headers gives our Message-ID back.
ECHO_HEADERS = ("x-evq-message-id", "message-id")


def verify_and_parse(
    headers: Mapping[str, str],
    body: bytes,
    config: WebhookConfig,
    now: datetime,
    query: Mapping[str, str] | None = None,
) -> list[DeliveryEvent]:
    from svix.webhooks import Webhook, WebhookVerificationError

    assert config.resend_secret
    msg_id, stamp, signature = (headers_get(headers, f"svix-{n}") for n in ("id", "timestamp", "signature"))
    if not (msg_id and stamp and signature):
        raise unsigned("svix-id, svix-timestamp and svix-signature are required")
    sent_at = unix_time(stamp)
    if sent_at is None:
        raise bad_signature("svix-timestamp is not a time")
    check_window(sent_at, now, TOLERANCE)
    try:
        Webhook(config.resend_secret).verify(
            body, {"svix-id": msg_id, "svix-timestamp": stamp, "svix-signature": signature}
        )
    except WebhookVerificationError as exc:
        if "too old" in str(exc) or "too new" in str(exc):
            raise replayed() from None
        raise bad_signature() from None
    except (ValueError, TypeError, UnicodeDecodeError):  # a signature that is not v1,base64
        raise bad_signature() from None
    return parse(load_json(body), msg_id)


def parse(payload: Any, event_id: str) -> list[DeliveryEvent]:
    if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
        raise malformed("a Resend event is an object with a type")
    data = payload.get("data")
    if not isinstance(data, dict):
        raise malformed("a Resend event carries data")
    kind = payload["type"]
    if kind == "email.bounced":
        bounce = data.get("bounce") if isinstance(data.get("bounce"), dict) else {}
        delivery: DeliveryType = "bounced_soft" if bounce.get("type") == "Transient" else "bounced_hard"
    elif kind in TYPES:
        delivery = TYPES[kind]
    else:
        return []
    to = data.get("to")
    recipient = to[0] if isinstance(to, list) and to else to
    return [
        DeliveryEvent(
            provider=PROVIDER,
            event_id=text(event_id, 200) or event_id[:200],
            type=delivery,
            occurred_at=iso_time(payload.get("created_at")) or iso_time(data.get("created_at")),
            key_digest=digest(_tag(data.get("tags"))),
            message_id=_echoed_message_id(data.get("headers")),
            provider_message_id=text(data.get("email_id"), 200),
            recipient=text(recipient),
            detail={
                "event": kind,
                **(
                    {"bounce": detail(data["bounce"], ("type", "subType", "message"))}
                    if isinstance(data.get("bounce"), dict)
                    else {}
                ),
            },
        )
    ]


def _tag(tags: Any) -> Any:
    """The ``evq_key`` tag: Resend shows tags as an object, or as ``[{name, value}]``."""
    if isinstance(tags, dict):
        return tags.get(KEY_TAG)
    if isinstance(tags, list):
        for tag in tags:
            if isinstance(tag, dict) and tag.get("name") == KEY_TAG:
                return tag.get("value")
    return None


def _echoed_message_id(headers: Any) -> str | None:
    pairs: list[tuple[Any, Any]] = []
    if isinstance(headers, dict):
        pairs = list(headers.items())
    elif isinstance(headers, list):
        pairs = [(h.get("name"), h.get("value")) for h in headers if isinstance(h, dict)]
    found = {str(name).lower(): value for name, value in pairs if isinstance(name, str)}
    for name in ECHO_HEADERS:
        if name in found and (value := message_id(found[name])):
            return value
    return None
