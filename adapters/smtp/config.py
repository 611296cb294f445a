"""The SMTP adapter's ``EVQ_SMTP_*`` options and the config built from them.

The one loader (ops/settings.py) reads these with every other option; ops/wiring.py
builds :class:`SmtpConfig` from it and the provider from that. Importing this module
costs nothing of the adapter itself (no smtplib), so every `evq` command can.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from evq.worker.delivery import DeliveryType
from evq.worker.options import Option, bad, boolean
from evq.worker.ports.providers import ProviderProfile

# A HELO/EHLO name: a domain of at least two labels, or an RFC 5321 address literal.
_HELO_NAME = re.compile(
    r"^(?:(?=.{1,253}$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"|\[(?:\d{1,3}(?:\.\d{1,3}){3}|IPv6:[0-9A-Fa-f:.]+)\])$"
)

# An SMTP relay that reads a metadata header of its own (adapters/smtp/message.py renders
# it) and echoes the value in its delivery webhooks: name -> the delivery types
# (worker/delivery.py) its events become.
RELAY_EVENTS: Final[Mapping[str, tuple[DeliveryType, ...]]] = {
    # delivered, deferred, bounce, blocked, spamreport, open, click
    "sendgrid": ("delivered", "deferred", "bounced_hard", "bounced_soft", "complained", "opened", "clicked"),
    # delivered, failed (permanent or temporary), complained, opened, clicked
    "mailgun": ("delivered", "deferred", "bounced_hard", "bounced_soft", "complained", "opened", "clicked"),
    # Delivery, Bounce (HardBounce, SoftBounce, ...), SpamComplaint, Open, Click
    "postmark": ("delivered", "bounced_hard", "bounced_soft", "complained", "opened", "clicked"),
    # Delivery, DeliveryDelay, Bounce (Permanent, Transient), Complaint, Open, Click
    "ses": ("delivered", "deferred", "bounced_hard", "bounced_soft", "complained", "opened", "clicked"),
}
RELAYS: Final = ("none", *RELAY_EVENTS)

OPTIONS: tuple[Option, ...] = (
    Option("smtp_host", str, "localhost", "SMTP server host."),
    Option("smtp_port", int, 25, "SMTP server port.", minimum=1),
    Option("smtp_username", str, None, "SMTP AUTH user (optional)."),
    Option("smtp_password", str, None, "SMTP AUTH password (never logged).", secret=True),
    Option(
        "smtp_tls", str, "none", "SMTP transport security: none, starttls, ssl.", choices=("none", "starttls", "ssl")
    ),
    Option("smtp_timeout", float, 30.0, "Seconds for each SMTP network operation.", minimum=0.1),
    Option(
        "smtp_helo_name",
        str,
        None,
        "Name evq greets the SMTP server with (EHLO/HELO). Unset: the host's fully-qualified name if it has a dot, "
        "else the address literal of the connection, e.g. [10.0.0.5] (never 'localhost', which strict servers refuse).",
    ),
    Option(
        "smtp_ca_file",
        str,
        None,
        "PEM bundle of the CA(s) trusted for the SMTP server's certificate (a private CA); unset: the system's trust store.",
    ),
    Option(
        "smtp_client_cert",
        str,
        None,
        "PEM client certificate (chain) for SMTP servers that require one; with EVQ_SMTP_CLIENT_KEY.",
    ),
    Option(
        "smtp_client_key",
        str,
        None,
        "PEM private key of EVQ_SMTP_CLIENT_CERT (unset: the key is in the certificate file).",
    ),
    Option(
        "smtp_allow_plain_auth",
        boolean,
        False,
        "Allow SMTP AUTH (EVQ_SMTP_USERNAME) over a connection without TLS, i.e. the password in clear; "
        "only for a trusted network. Default: refused.",
    ),
    Option(
        "smtp_relay",
        str,
        "none",
        "The SMTP server is this provider's relay: sendgrid, mailgun, postmark or ses (none: a plain server). "
        "Each message then carries the relay's metadata header with the key's digest (evq_key), which its "
        "webhooks echo: X-SMTPAPI, X-Mailgun-Variables, X-PM-Metadata-evq_key or X-SES-MESSAGE-TAGS.",
        choices=RELAYS,
    ),
)

_OPTION = {o.name: o for o in OPTIONS}


@dataclass(frozen=True, slots=True)
class SmtpConfig:
    """The EVQ_SMTP_* options without their prefix (a unit test compares them)."""

    host: str = "localhost"
    port: int = 25
    username: str | None = None
    password: str | None = None
    tls: str = "none"
    timeout: float = 30.0
    helo_name: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    allow_plain_auth: bool = False
    relay: str = "none"

    def validate(self) -> None:
        """The checks between these options, and the TLS files read now: a bad bundle or key
        fails at startup with its setting named, not as every send's TLS failure."""
        if bool(self.username) != bool(self.password):
            raise bad(_OPTION["smtp_username"], "and EVQ_SMTP_PASSWORD go together: set both or neither")
        if self.username and self.tls == "none" and not self.allow_plain_auth:
            raise bad(
                _OPTION["smtp_username"],
                "would send the SMTP password without TLS: set EVQ_SMTP_TLS=starttls or ssl "
                "(or EVQ_SMTP_ALLOW_PLAIN_AUTH=true on a trusted network)",
            )
        if self.helo_name is not None and not _HELO_NAME.match(self.helo_name):
            raise bad(
                _OPTION["smtp_helo_name"],
                f"must be a fully-qualified domain name or an address literal such as [192.0.2.1], got {self.helo_name!r}",
            )
        if self.client_key and not self.client_cert:
            raise bad(_OPTION["smtp_client_key"], "needs EVQ_SMTP_CLIENT_CERT")
        for name in ("ca_file", "client_cert", "client_key"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise bad(_OPTION["smtp_" + name], f"names no readable file: {path!r}")
        context = ssl.create_default_context()
        if self.ca_file:
            try:
                context.load_verify_locations(cafile=self.ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise bad(_OPTION["smtp_ca_file"], f"cannot be loaded as a PEM CA bundle: {exc}") from None
        if self.client_cert:
            try:
                context.load_cert_chain(self.client_cert, self.client_key)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise bad(_OPTION["smtp_client_cert"], f"and its key cannot be loaded: {exc}") from None


def profile(config: SmtpConfig, webhooks: Collection[str] = ()) -> ProviderProfile:
    """What this provider can do to settle a lost answer (docs/design.md, "Provider profiles"),
    from the settings alone. A plain SMTP server: nothing (no key it honours, nothing to ask, no
    webhook). Through a relay (EVQ_SMTP_RELAY) whose webhook is configured (``webhooks``, the
    webhook providers whose secret is set, names it): that relay's delivery events."""
    events = RELAY_EVENTS.get(config.relay, ()) if config.relay in webhooks else ()
    return ProviderProfile(dedupe_window=None, lookup_by=(), webhook_events=events)
