"""Postmark's webhooks, which Postmark does not sign: the webhook URL carries credentials
instead, HTTP basic auth (``https://user:password@host/v1/webhooks/postmark``) or a secret
token (``...?token=...``), compared in constant time with EVQ_WEBHOOK_POSTMARK_USER and
_PASSWORD, or _TOKEN. Without a timestamp there is no replay window: a replayed event is
the same event (the same id), which the store keeps once.

One event per request, by ``RecordType``: ``Delivery``; ``Bounce`` (``Type`` HardBounce,
BadEmailAddress, ManuallyDeactivated, or ``Inactive: true`` (Postmark deactivated the
address): hard; SpamComplaint: complained; the kinds that are not a failure to deliver
(AutoResponder, AddressChange, Subscribe, Unsubscribe, ChallengeVerification,
OpenRelayTest): ignored; every other kind soft); ``SpamComplaint``; ``Open``; ``Click``.
Matched by ``Metadata.evq_key``. Dedupe: the bounce's ``ID``; the other records have none,
so one is derived from the record type, Postmark's MessageID, recipient and time.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from evq.adapters.webhooks.common import (
    bad_signature,
    clean,
    derived_id,
    detail,
    digest,
    headers_get,
    iso_time,
    load_json,
    malformed,
    text,
    unsigned,
)
from evq.adapters.webhooks.config import WebhookConfig
from evq.worker.delivery import KEY_TAG, DeliveryEvent, DeliveryType

PROVIDER = "postmark"
HARD = frozenset({"HardBounce", "BadEmailAddress", "ManuallyDeactivated"})
NOT_A_FAILURE = frozenset(
    {"AutoResponder", "AddressChange", "Subscribe", "Unsubscribe", "ChallengeVerification", "OpenRelayTest"}
)
TYPES: dict[str, DeliveryType] = {
    "Delivery": "delivered",
    "SpamComplaint": "complained",
    "Open": "opened",
    "Click": "clicked",
}
_KEPT = ("RecordType", "Type", "TypeCode", "Inactive", "Description", "Details", "ServerID", "Tag", "MessageStream")


def _same(given: str, expected: str) -> bool:
    # surrogatepass: a lone surrogate in what the peer sent is a wrong credential, not a crash.
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode())


def authenticate(headers: Mapping[str, str], query: Mapping[str, str], config: WebhookConfig) -> None:
    """Either credential the settings name, compared in constant time; nothing is compared
    against a credential that is not configured."""
    authorization = headers_get(headers, "authorization")
    token = query.get("token")
    if not authorization and not token:
        raise unsigned("basic auth or ?token= is required")
    ok = False
    if token and config.postmark_token:
        ok |= _same(token, config.postmark_token)
    if authorization and config.postmark_user and config.postmark_password:
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() == "basic":
            try:
                user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
            except (binascii.Error, ValueError, UnicodeDecodeError):
                user, sep, password = "", "", ""
            # Both compared, always, so the time says nothing about which one was wrong.
            ok |= bool(sep) & _same(user, config.postmark_user) & _same(password, config.postmark_password)
    if not ok:
        raise bad_signature("the credentials are wrong")


def verify_and_parse(
    headers: Mapping[str, str],
    body: bytes,
    config: WebhookConfig,
    now: datetime,
    query: Mapping[str, str] | None = None,
) -> list[DeliveryEvent]:
    authenticate(headers, query or {}, config)
    return parse(load_json(body))


def parse(record: Any) -> list[DeliveryEvent]:
    if not isinstance(record, dict) or not isinstance(record.get("RecordType"), str):
        raise malformed("a Postmark event is an object with a RecordType")
    kind = record["RecordType"]
    bounce_type = record.get("Type")
    if kind == "Bounce":
        if bounce_type in NOT_A_FAILURE:
            return []
        if bounce_type == "SpamComplaint":
            delivery: DeliveryType = "complained"
        elif bounce_type in HARD or record.get("Inactive") is True:
            delivery = "bounced_hard"
        else:
            delivery = "bounced_soft"
    elif kind in TYPES:
        delivery = TYPES[kind]
    else:
        return []
    recipient = record.get("Recipient") or record.get("Email")
    at = record.get("DeliveredAt") or record.get("BouncedAt") or record.get("ReceivedAt")
    metadata = record.get("Metadata") if isinstance(record.get("Metadata"), dict) else {}
    bounce_id = record.get("ID")
    if kind in ("Bounce", "SpamComplaint") and isinstance(bounce_id, int | str) and str(bounce_id):
        event_id = f"{kind.lower()}:{clean(str(bounce_id))[:100]}"
    else:
        event_id = derived_id(PROVIDER, kind, record.get("MessageID"), recipient, at, record.get("OriginalLink"))
    return [
        DeliveryEvent(
            provider=PROVIDER,
            event_id=event_id,
            type=delivery,
            occurred_at=iso_time(at),
            key_digest=digest(metadata.get(KEY_TAG)),
            provider_message_id=text(record.get("MessageID"), 200),
            recipient=text(recipient),
            detail=detail(record, _KEPT),
        )
    ]
