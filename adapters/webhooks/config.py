"""The delivery webhooks' ``EVQ_WEBHOOK_*`` options and the config built from them.

The one loader (ops/settings.py) reads these with every other option; ops/wiring.py builds
:class:`WebhookConfig` from it and the receivers from that (adapters/webhooks/__init__.py).
A provider with none of its settings has no receiver: its route answers 404
(``not_configured``). Importing this module costs nothing of the receivers themselves.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass

from evq.worker.options import Option, bad, duration

# The hosts SNS serves its signing certificates (and subscription URLs) from:
# https://sns.<region>.amazonaws.com, and .amazonaws.com.cn in China.
SNS_HOSTS = r"sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?"


def comma_list(value: str) -> tuple[str, ...]:
    """A comma-separated list, case kept (ARNs are case-sensitive)."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


OPTIONS: tuple[Option, ...] = (
    Option(
        "webhook_max_body",
        int,
        1024 * 1024,
        "Largest provider webhook body `evq serve` reads (POST /v1/webhooks/{provider}), in bytes; 413 beyond "
        "(a smaller EVQ_SERVE_MAX_BODY applies first).",
        minimum=1024,
    ),
    Option(
        "webhook_tolerance",
        duration,
        300.0,
        "How far a signed webhook's timestamp (SendGrid, Mailgun; Resend's Svix signature is fixed at 5 minutes) "
        "may be from now, either way; older is refused as replayed.",
        minimum=1,
    ),
    Option(
        "webhook_resend_secret",
        str,
        None,
        "Resend's webhook signing secret (whsec_...); enables POST /v1/webhooks/resend.",
        secret=True,
    ),
    Option(
        "webhook_sendgrid_public_key",
        str,
        None,
        "SendGrid's Signed Event Webhook verification key (base64 DER, as the dashboard shows it); enables "
        "POST /v1/webhooks/sendgrid.",
    ),
    Option(
        "webhook_postmark_user",
        str,
        None,
        "User of the HTTP basic auth Postmark's webhook URL carries (with EVQ_WEBHOOK_POSTMARK_PASSWORD); enables "
        "POST /v1/webhooks/postmark.",
    ),
    Option(
        "webhook_postmark_password",
        str,
        None,
        "Password of that basic auth (never logged).",
        secret=True,
    ),
    Option(
        "webhook_postmark_token",
        str,
        None,
        "Instead of (or beside) basic auth: a secret Postmark's webhook URL carries as ?token=...; enables "
        "POST /v1/webhooks/postmark.",
        secret=True,
    ),
    Option(
        "webhook_mailgun_signing_key",
        str,
        None,
        "Mailgun's HTTP webhook signing key; enables POST /v1/webhooks/mailgun.",
        secret=True,
    ),
    Option(
        "webhook_ses_topic_arns",
        comma_list,
        (),
        "The SNS topic ARNs whose SES events evq believes, comma-separated; enables POST /v1/webhooks/ses.",
    ),
    Option(
        "webhook_sns_cert_hosts",
        str,
        SNS_HOSTS,
        "Regular expression a host must match, whole, for evq to fetch an SNS signing certificate or confirm a "
        "subscription there (always over https).",
    ),
    Option(
        "webhook_sns_ca_file",
        str,
        None,
        "PEM bundle trusted for those https fetches instead of the system's (a private CA; tests).",
    ),
    Option(
        "webhook_sns_tolerance",
        duration,
        3600.0,
        "How old an SNS message's Timestamp may be (SNS retries resend the same signed message); older is "
        "refused as replayed.",
        minimum=1,
    ),
)

_OPTION = {o.name: o for o in OPTIONS}
PROVIDERS = ("resend", "sendgrid", "postmark", "mailgun", "ses")


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """The EVQ_WEBHOOK_* options without their prefix (a unit test compares them)."""

    max_body: int = 1024 * 1024
    tolerance: float = 300.0
    resend_secret: str | None = None
    sendgrid_public_key: str | None = None
    postmark_user: str | None = None
    postmark_password: str | None = None
    postmark_token: str | None = None
    mailgun_signing_key: str | None = None
    ses_topic_arns: tuple[str, ...] = ()
    sns_cert_hosts: str = SNS_HOSTS
    sns_ca_file: str | None = None
    sns_tolerance: float = 3600.0

    def configured(self) -> tuple[str, ...]:
        """The providers whose webhooks can be verified with these settings."""
        have = {
            "resend": bool(self.resend_secret),
            "sendgrid": bool(self.sendgrid_public_key),
            "postmark": bool(self.postmark_password or self.postmark_token),
            "mailgun": bool(self.mailgun_signing_key),
            "ses": bool(self.ses_topic_arns),
        }
        return tuple(p for p in PROVIDERS if have[p])

    def validate(self) -> None:
        """What can be checked without a request: a setting that could never verify one fails at start."""
        if self.resend_secret:
            raw = self.resend_secret.removeprefix("whsec_").rstrip("=")
            try:
                if not base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True):
                    raise ValueError("empty")
            except ValueError:
                raise bad(_OPTION["webhook_resend_secret"], "is not a Svix secret (whsec_ and base64)") from None
        if self.sendgrid_public_key:
            from cryptography.hazmat.primitives.asymmetric import ec
            from cryptography.hazmat.primitives.serialization import load_der_public_key

            try:
                key = load_der_public_key(base64.b64decode(self.sendgrid_public_key, validate=True))
            except ValueError:
                raise bad(_OPTION["webhook_sendgrid_public_key"], "is not a base64 DER public key") from None
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise bad(_OPTION["webhook_sendgrid_public_key"], "is not an elliptic-curve (ECDSA) key")
        if bool(self.postmark_user) != bool(self.postmark_password):
            raise bad(
                _OPTION["webhook_postmark_user"], "and EVQ_WEBHOOK_POSTMARK_PASSWORD go together: set both or neither"
            )
        for secret in ("postmark_password", "postmark_token", "mailgun_signing_key"):
            value = getattr(self, secret)
            if value is not None and len(value) < 16:
                raise bad(_OPTION["webhook_" + secret], "is too short to be a secret (at least 16 characters)")
        try:
            re.compile(self.sns_cert_hosts)
        except re.error as exc:
            raise bad(_OPTION["webhook_sns_cert_hosts"], f"is not a regular expression: {exc}") from None
        for arn in self.ses_topic_arns:
            if not arn.startswith("arn:") or arn.count(":") < 5:
                raise bad(
                    _OPTION["webhook_ses_topic_arns"], f"names something that is not an SNS topic ARN: {arn[:100]!r}"
                )
