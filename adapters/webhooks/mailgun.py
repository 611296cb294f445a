"""Mailgun's webhooks: the signature is in the JSON body, ``signature: {timestamp, token,
signature}``, where ``signature`` is the hex HMAC-SHA256 of ``timestamp`` followed by
``token`` under the webhook signing key (``parent-signature`` for a subaccount's events,
under the same key of the primary account, is accepted too), compared in constant time.

Replay: a timestamp further than EVQ_WEBHOOK_TOLERANCE from now is refused. Within it, evq
keeps no table of tokens in the database: a replayed request is the same event with the same
``event-data.id``, which the store keeps once (append-only, deduplicated by event id), so
replaying it changes nothing. Mailgun's signature does not cover ``event-data``, though, so
each receiver remembers (in memory, for the tolerance) the tokens it verified with a digest
of their body: the same token with other bytes is refused as ``replayed``. Several `evq
serve` processes do not share that memory; what stops a forger there is the window.

``event-data``: ``delivered``; ``failed`` with ``severity`` permanent (hard) or temporary
(soft; Mailgun retries it); ``complained``; ``opened``; ``clicked``. Matched by
``user-variables.evq_key`` and ``message.headers.message-id`` (Mailgun drops the angle
brackets; they are put back). Dedupe: ``event-data.id``.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from evq.adapters.webhooks.common import (
    bad_signature,
    check_window,
    derived_id,
    detail,
    digest,
    load_json,
    malformed,
    message_id,
    replayed,
    text,
    unix_time,
    unsigned,
    utf8,
)
from evq.adapters.webhooks.config import WebhookConfig
from evq.worker.delivery import KEY_TAG, DeliveryEvent, DeliveryType

PROVIDER = "mailgun"
TYPES: dict[str, DeliveryType] = {
    "delivered": "delivered",
    "complained": "complained",
    "opened": "opened",
    "clicked": "clicked",
}
_KEPT = ("event", "severity", "reason", "log-level")


class SeenTokens:
    """Tokens verified lately, each with the SHA-256 of its body, forgotten after twice the tolerance."""

    LIMIT = 100_000

    def __init__(self) -> None:
        self._seen: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def check(self, token: str, body: bytes, keep: float) -> None:
        body_digest = hashlib.sha256(body).hexdigest()
        now = time.monotonic()
        with self._lock:
            if len(self._seen) >= self.LIMIT:
                self._seen = {t: v for t, v in self._seen.items() if v[0] > now}
            seen = self._seen.get(token)
            if seen is not None and seen[0] > now and seen[1] != body_digest:
                raise replayed("this token was signed for another body")
            self._seen[token] = (now + 2 * keep, body_digest)


def verify_and_parse(
    headers: Mapping[str, str],
    body: bytes,
    config: WebhookConfig,
    now: datetime,
    query: Mapping[str, str] | None = None,
    seen: SeenTokens | None = None,
) -> list[DeliveryEvent]:
    assert config.mailgun_signing_key
    payload = load_json(body)
    signed = payload.get("signature") if isinstance(payload, dict) else None
    if not isinstance(signed, dict):
        raise unsigned("the body carries no signature object")
    stamp, token = signed.get("timestamp"), signed.get("token")
    given = [s for s in (signed.get("signature"), signed.get("parent-signature")) if isinstance(s, str)]
    if not (isinstance(stamp, str | int) and isinstance(token, str) and token and given):
        raise unsigned("signature.timestamp, .token and .signature are required")
    signed_bytes = utf8(f"{stamp}{token}", "signature.token")
    expected = hmac.new(config.mailgun_signing_key.encode(), signed_bytes, hashlib.sha256).hexdigest()
    if not any(
        hmac.compare_digest(expected.encode(), s.strip().lower().encode("utf-8", "surrogatepass")) for s in given
    ):
        raise bad_signature()
    sent_at = unix_time(stamp)
    if sent_at is None:
        raise malformed("signature.timestamp is not a time")
    check_window(sent_at, now, config.tolerance)
    if seen is not None:
        seen.check(token, body, config.tolerance)
    return parse(payload.get("event-data"))


def parse(event: Any) -> list[DeliveryEvent]:
    if not isinstance(event, dict) or not isinstance(event.get("event"), str):
        raise malformed("event-data is an object with an event")
    kind = event["event"]
    if kind == "failed":
        delivery: DeliveryType = "bounced_soft" if event.get("severity") == "temporary" else "bounced_hard"
        if event.get("severity") not in ("temporary", "permanent"):
            raise malformed("a failed event's severity is permanent or temporary")
    elif kind in TYPES:
        delivery = TYPES[kind]
    else:
        return []
    message = event.get("message") if isinstance(event.get("message"), dict) else {}
    headers = message.get("headers") if isinstance(message.get("headers"), dict) else {}
    variables = event.get("user-variables") if isinstance(event.get("user-variables"), dict) else {}
    status = event.get("delivery-status") if isinstance(event.get("delivery-status"), dict) else {}
    raw_id = headers.get("message-id")
    return [
        DeliveryEvent(
            provider=PROVIDER,
            event_id=text(event.get("id"), 200)
            or derived_id(PROVIDER, kind, raw_id, event.get("recipient"), event.get("timestamp")),
            type=delivery,
            occurred_at=unix_time(event.get("timestamp")),
            key_digest=digest(variables.get(KEY_TAG)),
            message_id=message_id(raw_id),
            provider_message_id=text(raw_id, 200),
            recipient=text(event.get("recipient")),
            detail={
                **detail(event, _KEPT),
                **({"delivery_status": detail(status, ("code", "message", "description"))} if status else {}),
            },
        )
    ]
