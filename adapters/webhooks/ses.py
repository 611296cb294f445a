"""Amazon SES events delivered by Amazon SNS over HTTPS.

Every SNS message is signed: ``Signature`` (base64) over the documented string to sign
(``Key\\nvalue\\n`` for Message, MessageId, Subject if present, Timestamp, TopicArn, Type of
a Notification; Message, MessageId, SubscribeURL, Timestamp, Token, TopicArn, Type of a
(Un)SubscriptionConfirmation), with SHA1withRSA for ``SignatureVersion`` 1 and
SHA256withRSA for 2, by the certificate at ``SigningCertURL``. That certificate is fetched
only over https from a host that matches EVQ_WEBHOOK_SNS_CERT_HOSTS whole (by default
``sns.<region>.amazonaws.com``; on a port other than 443 the pattern must match
``host:port``), at SNS's path ``/SimpleNotificationService-<hex>.pem``, never following a
redirect, and cached by URL. Since it is fetched before anything is verified, a forger's
URLs cost little: at most CERT_FETCHES fetches at once (beyond: 503 at once), a short
connect timeout, and a URL that failed is not fetched again for FAILED_FOR seconds. The topic
must be one of EVQ_WEBHOOK_SES_TOPIC_ARNS, checked before anything is fetched; the
Timestamp must be within EVQ_WEBHOOK_SNS_TOLERANCE (SNS resends the same signed message when
it retries, so this is longer than the others').

A SubscriptionConfirmation, once verified, is confirmed by GET of its SubscribeURL (the same
host rule) and answered 200. A Notification's Message is the SES event: ``eventType`` (a
configuration set's event destination) or ``notificationType`` (an identity's
notifications): Delivery; Bounce (``bounceType`` Permanent: hard; Transient or
Undetermined: soft); Complaint; DeliveryDelay (deferred); Open; Click; one event per
recipient. Matched by the ``evq_key`` message tag (``mail.tags``) and our Message-ID
(``mail.commonHeaders.messageId``, or the Message-ID in ``mail.headers``). Dedupe: SNS's
MessageId (with the recipient's index when the event names several).
"""

from __future__ import annotations

import base64
import binascii
import re
import ssl
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from evq.adapters.webhooks.common import (
    bad_signature,
    detail,
    digest,
    iso_time,
    load_json,
    malformed,
    message_id,
    replayed,
    text,
    unsigned,
    utf8,
)
from evq.adapters.webhooks.config import WebhookConfig
from evq.worker.delivery import KEY_TAG, DeliveryEvent, DeliveryType
from evq.worker.logs import get_logger
from evq.worker.ports.webhooks import WebhookRefused

PROVIDER = "ses"
log = get_logger("evq.webhooks")

_SIGNED = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
_OPTIONAL = frozenset({"Subject"})
MAX_CERT_BYTES = 64 * 1024
FETCH_TIMEOUT = 10.0
CONNECT_TIMEOUT = 3.0
CACHE_SIZE = 32
# Certificate fetches at once, per receiver: beyond them a message is refused at once (503
# cert_unavailable; SNS retries), so unverified messages cannot hold the server's threads.
CERT_FETCHES = 2
FAILED_FOR = 60.0  # a URL whose fetch failed is not fetched again for this long
FAILED_SIZE = 1024
# The path of every SNS signing certificate: SimpleNotificationService-<hex>.pem.
CERT_PATH = re.compile(r"/SimpleNotificationService-[0-9a-f]+\.pem")

# SES event -> (the key of its detail object, its recipients' list key).
_EVENTS: dict[str, tuple[str, str | None]] = {
    "Delivery": ("delivery", "recipients"),
    "Bounce": ("bounce", "bouncedRecipients"),
    "Complaint": ("complaint", "complainedRecipients"),
    "DeliveryDelay": ("deliveryDelay", "delayedRecipients"),
    "Open": ("open", None),
    "Click": ("click", None),
}
_TYPES: dict[str, DeliveryType] = {
    "Delivery": "delivered",
    "Complaint": "complained",
    "DeliveryDelay": "deferred",
    "Open": "opened",
    "Click": "clicked",
}
_KEPT = (
    "bounceType",
    "bounceSubType",
    "complaintFeedbackType",
    "delayType",
    "smtpResponse",
    "reportingMTA",
    "feedbackId",
)


def string_to_sign(message: Mapping[str, Any]) -> bytes:
    """The documented string SNS signs for this message type."""
    names = _SIGNED[message["Type"]]
    out = []
    for name in names:
        value = message.get(name)
        if value is None and name in _OPTIONAL:
            continue
        if not isinstance(value, str):
            raise malformed(f"an SNS {message['Type']} carries {name}")
        out.append(f"{name}\n{value}\n")
    return utf8("".join(out), "the SNS message")


class SnsReceiver:
    """The SES receiver: verifies SNS messages with certificates it fetches and caches."""

    def __init__(self, config: WebhookConfig):
        self.config = config
        self.hosts = re.compile(config.sns_cert_hosts)
        self._certs: dict[str, Any] = {}
        self._failed: dict[str, float] = {}  # URL -> monotonic time until which it is not fetched again
        self._fetches = threading.BoundedSemaphore(CERT_FETCHES)
        self._lock = threading.Lock()
        self._tls = ssl.create_default_context(cafile=config.sns_ca_file) if config.sns_ca_file else None

    def __call__(
        self, headers: Mapping[str, str], body: bytes, query: Mapping[str, str], now: datetime
    ) -> list[DeliveryEvent]:
        return self.verify_and_parse(headers, body, now)

    def sns_url(self, url: Any, *, cert: bool = False) -> str:
        """``url`` if it is https on an SNS host (EVQ_WEBHOOK_SNS_CERT_HOSTS), else ``foreign_cert``.
        The pattern is matched against the host alone on port 443, and against ``host:port`` on
        any other port, so only a pattern that spells a port (the tests' loopback server) allows
        one. ``cert``: the path must also be SNS's ``/SimpleNotificationService-<hex>.pem``."""
        try:
            parts = urlsplit(url) if isinstance(url, str) else None
            host = parts.hostname if parts else None
            port = parts.port if parts else None
        except ValueError:
            parts, host, port = None, None, None
        where = host if port in (None, 443) else f"{host}:{port}"
        if parts is None or parts.scheme != "https" or not host or not self.hosts.fullmatch(where) or parts.username:
            raise WebhookRefused(403, "foreign_cert", "the URL is not https on an SNS host")
        if cert and (not CERT_PATH.fullmatch(parts.path) or parts.query or parts.fragment):
            raise WebhookRefused(403, "foreign_cert", "the URL is not an SNS signing certificate's")
        return str(url)

    def verify_and_parse(self, headers: Mapping[str, str], body: bytes, now: datetime) -> list[DeliveryEvent]:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        message = load_json(body)
        if not isinstance(message, dict) or message.get("Type") not in _SIGNED:
            raise malformed("an SNS message has a Type of Notification or (Un)SubscriptionConfirmation")
        if not message.get("Signature") or not message.get("SigningCertURL"):
            raise unsigned("an SNS message carries Signature and SigningCertURL")
        if message.get("TopicArn") not in self.config.ses_topic_arns:
            raise WebhookRefused(403, "wrong_topic", "the topic is not in EVQ_WEBHOOK_SES_TOPIC_ARNS")
        version = message.get("SignatureVersion")
        if version not in ("1", "2"):
            raise bad_signature("SignatureVersion is 1 or 2")
        url = self.sns_url(message["SigningCertURL"], cert=True)
        if message["Type"] == "SubscriptionConfirmation":
            self.sns_url(message.get("SubscribeURL"))  # refused before anything is fetched
        signed = string_to_sign(message)
        key = self._public_key(url)
        try:
            signature = base64.b64decode(str(message["Signature"]), validate=True)
            algorithm = hashes.SHA1() if version == "1" else hashes.SHA256()  # SNS signature version 1 is SHA1withRSA
            key.verify(signature, signed, padding.PKCS1v15(), algorithm)
        except (InvalidSignature, binascii.Error, ValueError, TypeError):
            raise bad_signature() from None
        stamp = iso_time(message.get("Timestamp"))
        if stamp is None:
            raise malformed("Timestamp is not a time")
        if (now - stamp).total_seconds() > self.config.sns_tolerance or (stamp - now).total_seconds() > 300:
            raise replayed()
        if message["Type"] == "SubscriptionConfirmation":
            self._confirm(message)
            return []
        if message["Type"] == "UnsubscribeConfirmation":
            return []
        return parse(message)

    def _get(self, url: str, limit: int) -> bytes:
        import httpx

        timeout = httpx.Timeout(FETCH_TIMEOUT, connect=CONNECT_TIMEOUT)
        with httpx.Client(verify=self._tls or True, timeout=timeout, follow_redirects=False) as client:
            with client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise OSError(f"HTTP {response.status_code}")
                data = b""
                for chunk in response.iter_bytes():
                    data += chunk
                    if len(data) > limit:
                        raise OSError("too large")
                return data

    def _public_key(self, url: str) -> Any:
        from cryptography import x509

        now = time.monotonic()
        with self._lock:
            if url in self._certs:
                return self._certs[url]
            if self._failed.get(url, 0.0) > now:
                raise WebhookRefused(503, "cert_unavailable", "the signing certificate could not be fetched lately")
        if not self._fetches.acquire(blocking=False):
            log.warning("webhook_cert_busy", provider=PROVIDER)
            raise WebhookRefused(503, "cert_unavailable", "too many signing certificates are being fetched")
        try:
            try:
                pem = self._get(url, MAX_CERT_BYTES)
            except Exception as exc:  # any failure to fetch: evq could not check, the provider retries
                log.warning("webhook_cert_unavailable", provider=PROVIDER, error_class=type(exc).__name__)
                self._fail(url)
                raise WebhookRefused(503, "cert_unavailable", "the signing certificate could not be fetched") from None
        finally:
            self._fetches.release()
        try:
            key = x509.load_pem_x509_certificate(pem).public_key()
        except ValueError:
            self._fail(url)
            raise WebhookRefused(503, "cert_unavailable", "the signing certificate is not a PEM certificate") from None
        with self._lock:
            if len(self._certs) >= CACHE_SIZE:
                self._certs.pop(next(iter(self._certs)))
            self._certs[url] = key
        return key

    def _fail(self, url: str) -> None:
        """Remember for :data:`FAILED_FOR` that ``url`` could not be fetched (bounded; expired ones go first)."""
        now = time.monotonic()
        with self._lock:
            if len(self._failed) >= FAILED_SIZE:
                self._failed = {u: t for u, t in self._failed.items() if t > now}
                while len(self._failed) >= FAILED_SIZE:
                    self._failed.pop(next(iter(self._failed)))
            self._failed[url] = now + FAILED_FOR

    def _confirm(self, message: Mapping[str, Any]) -> None:
        url = self.sns_url(message.get("SubscribeURL"))
        try:
            self._get(url, MAX_CERT_BYTES)
        except Exception as exc:
            log.warning("webhook_subscribe_failed", provider=PROVIDER, error_class=type(exc).__name__)
            raise WebhookRefused(503, "subscribe_failed", "the subscription could not be confirmed") from None
        log.info("webhook_subscribed", provider=PROVIDER, topic=message.get("TopicArn"))


def parse(message: Mapping[str, Any]) -> list[DeliveryEvent]:
    raw = message.get("Message")
    event = load_json(utf8(raw, "the SNS Message")) if isinstance(raw, str) else None
    if not isinstance(event, dict):
        raise malformed("the SNS Message is an SES event")
    kind = event.get("eventType") or event.get("notificationType")
    if kind not in _EVENTS:
        return []  # Send, Reject, RenderingFailure, Subscription, AmazonSnsSubscriptionSucceeded
    section_key, recipients_key = _EVENTS[kind]
    section = event.get(section_key) if isinstance(event.get(section_key), dict) else {}
    if kind == "Bounce":
        delivery: DeliveryType = "bounced_hard" if section.get("bounceType") == "Permanent" else "bounced_soft"
    else:
        delivery = _TYPES[kind]
    mail = event.get("mail") if isinstance(event.get("mail"), dict) else {}
    tags = mail.get("tags") if isinstance(mail.get("tags"), dict) else {}
    recipients: list[Any] = []
    if recipients_key is not None and isinstance(section.get(recipients_key), list):
        recipients = [r.get("emailAddress") if isinstance(r, dict) else r for r in section[recipients_key]]
    if not recipients:
        destination = mail.get("destination")
        recipients = [destination[0] if isinstance(destination, list) and len(destination) == 1 else None]
    sns_id = text(message.get("MessageId"), 150) or ""
    if not sns_id:
        raise malformed("an SNS message carries a MessageId")
    base = {
        "provider": PROVIDER,
        "type": delivery,
        "occurred_at": iso_time(section.get("timestamp")) or iso_time(mail.get("timestamp")),
        "key_digest": digest(tags.get(KEY_TAG)),
        "message_id": _our_message_id(mail),
        "provider_message_id": text(mail.get("messageId"), 200),
        "detail": {"event": kind, **detail(section, _KEPT)},
    }
    return [
        DeliveryEvent(event_id=sns_id if len(recipients) == 1 else f"{sns_id}:{i}", recipient=text(r), **base)
        for i, r in enumerate(recipients[:100])
    ]


def _our_message_id(mail: Mapping[str, Any]) -> str | None:
    common = mail.get("commonHeaders")
    if isinstance(common, dict) and (found := message_id(common.get("messageId"))):
        return found
    headers = mail.get("headers")
    if isinstance(headers, list):
        for header in headers:
            if isinstance(header, dict) and str(header.get("name", "")).lower() == "message-id":
                return message_id(header.get("value"))
    return None
