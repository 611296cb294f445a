"""Real signatures for the providers' delivery webhooks, made the way each provider makes
them (issue 16): Svix's own signing for Resend, an ECDSA P-256 key pair for SendGrid, HMAC
for Mailgun, basic auth for Postmark, and for SNS a CA of the test's own, a signing
certificate it issued, and a local HTTPS server that serves that certificate and answers
subscription confirmations (the fixture ``sns``)."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import secrets
import ssl
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from evq.adapters.webhooks.ses import string_to_sign

RESEND_SECRET = "whsec_" + base64.b64encode(b"resend-test-secret-0123456789ab").decode()
MAILGUN_KEY = "mailgun-signing-key-" + "7" * 24
POSTMARK_USER, POSTMARK_PASSWORD = "postmark-hook", "postmark-password-0123456789"
TOPIC = "arn:aws:sns:eu-west-1:123456789012:evq-ses-events"


def now_unix() -> int:
    return int(datetime.now(UTC).timestamp())


def resend(payload: dict[str, Any], *, secret: str = RESEND_SECRET, at: int | None = None, msg_id: str | None = None):
    """(headers, body) signed by svix itself."""
    from svix.webhooks import Webhook

    body = json.dumps(payload)
    msg_id = msg_id or "msg_" + secrets.token_hex(8)
    stamp = now_unix() if at is None else at
    signature = Webhook(secret).sign(msg_id, datetime.fromtimestamp(stamp, UTC), body)
    return {"svix-id": msg_id, "svix-timestamp": str(stamp), "svix-signature": signature}, body.encode()


class SendGridKey:
    """A P-256 key pair: the public half as SendGrid's dashboard shows it (base64 DER)."""

    def __init__(self) -> None:
        self.private = ec.generate_private_key(ec.SECP256R1())
        der = self.private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        self.public = base64.b64encode(der).decode()

    def sign(self, events: list[dict[str, Any]], *, at: int | None = None):
        body = json.dumps(events).encode()
        stamp = str(now_unix() if at is None else at)
        signature = self.private.sign(stamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        return {
            "x-twilio-email-event-webhook-signature": base64.b64encode(signature).decode(),
            "x-twilio-email-event-webhook-timestamp": stamp,
        }, body


def mailgun(event_data: dict[str, Any], *, key: str = MAILGUN_KEY, at: int | None = None, token: str | None = None):
    stamp = str(now_unix() if at is None else at)
    token = token or secrets.token_hex(25)
    signature = hmac.new(key.encode(), (stamp + token).encode(), hashlib.sha256).hexdigest()
    body = {"signature": {"timestamp": stamp, "token": token, "signature": signature}, "event-data": event_data}
    return {}, json.dumps(body).encode()


def postmark(record: dict[str, Any], *, user: str = POSTMARK_USER, password: str = POSTMARK_PASSWORD):
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"authorization": f"Basic {auth}"}, json.dumps(record).encode()


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _cert(subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool, san: bool = False) -> x509.Certificate:
    start = datetime.now(UTC) - dt.timedelta(hours=1)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class Sns:
    """SNS as the test plays it: a CA, an HTTPS server on 127.0.0.1 that serves the signing
    certificate and records each GET (subscription confirmations), and a signer. The server
    is on a loopback port, which the host pattern must spell (port 443 needs none); a GET of a
    certificate whose name holds ``feed`` waits until :attr:`release` is set."""

    HOSTS = r"127\.0\.0\.1:\d+"
    CERT = "/SimpleNotificationService-0123456789abcdef.pem"

    def __init__(self, folder: Path):
        ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ca = _cert("evq test CA", ca_key, "evq test CA", ca_key, ca=True)
        server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        server = _cert("127.0.0.1", server_key, "evq test CA", ca_key, ca=False, san=True)
        self.signing_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.signing_pem = _pem(_cert("sns.amazonaws.com", self.signing_key, "evq test CA", ca_key, ca=False))
        self.ca_file = folder / "ca.pem"
        self.ca_file.write_bytes(_pem(ca))
        chain, key_file = folder / "server.pem", folder / "server.key"
        chain.write_bytes(_pem(server))
        key_file.write_bytes(
            server_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        self.gets: list[str] = []
        self.release = threading.Event()
        sns = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                sns.gets.append(self.path)
                if "feed" in self.path:
                    sns.release.wait()
                    self.send_error(404)
                    return
                if self.path == sns.CERT:
                    body, ctype = sns.signing_pem, "application/x-pem-file"
                elif self.path.startswith("/confirm"):
                    body, ctype = b"<ConfirmSubscriptionResponse/>", "text/xml"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(chain, key_file)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def settings(self) -> dict[str, Any]:
        return {
            "webhook_ses_topic_arns": (TOPIC,),
            "webhook_sns_cert_hosts": self.HOSTS,
            "webhook_sns_ca_file": str(self.ca_file),
        }

    def message(
        self,
        ses_event: dict[str, Any] | None = None,
        *,
        kind: str = "Notification",
        version: str = "1",
        topic: str = TOPIC,
        at: datetime | None = None,
        cert_url: str | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """A signed SNS message (the body SNS POSTs)."""
        message: dict[str, Any] = {
            "Type": kind,
            "MessageId": "sns-" + secrets.token_hex(8),
            "TopicArn": topic,
            "Message": json.dumps(ses_event) if ses_event is not None else "You have chosen to subscribe.",
            "Timestamp": (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "SignatureVersion": version,
            "SigningCertURL": cert_url or self.url + self.CERT,
        }
        if kind != "Notification":
            message["Token"] = secrets.token_hex(16)
            message["SubscribeURL"] = f"{self.url}/confirm?Token={message['Token']}"
        message.update(extra)
        return self.sign(message)

    def sign(self, message: dict[str, Any]) -> dict[str, Any]:
        algorithm = hashes.SHA1() if message["SignatureVersion"] == "1" else hashes.SHA256()
        signature = self.signing_key.sign(string_to_sign(message), padding.PKCS1v15(), algorithm)
        return {**message, "Signature": base64.b64encode(signature).decode()}


def ses_event(kind: str = "Delivery", *, key_digest: str | None = None, message_id: str | None = None, **section: Any):
    """An SES event as a configuration set publishes it (eventType)."""
    mail: dict[str, Any] = {
        "timestamp": "2026-12-01T10:00:00.000Z",
        "messageId": "0102018f-ses-" + secrets.token_hex(6),
        "destination": ["user@example.com"],
        "tags": {"evq_key": [key_digest]} if key_digest else {},
        "commonHeaders": {"messageId": message_id} if message_id else {},
    }
    sections = {
        "Delivery": ("delivery", {"timestamp": "2026-12-01T10:00:01.000Z", "recipients": ["user@example.com"]}),
        "Bounce": ("bounce", {"bounceType": "Permanent", "bouncedRecipients": [{"emailAddress": "user@example.com"}]}),
        "Complaint": ("complaint", {"complainedRecipients": [{"emailAddress": "user@example.com"}]}),
        "DeliveryDelay": (
            "deliveryDelay",
            {"delayType": "MailboxFull", "delayedRecipients": [{"emailAddress": "u@x.org"}]},
        ),
    }
    name, body = sections[kind]
    return {"eventType": kind, "mail": mail, name: {**body, **section}}


@pytest.fixture
def sns() -> Iterator[Sns]:
    with tempfile.TemporaryDirectory() as folder:
        server = Sns(Path(folder))
        try:
            yield server
        finally:
            server.close()
