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
from urllib.parse import unquote, urlsplit

from evq.adapters.smtp.witness import MAX_JOURNAL_LOCAL, TAG_HEX
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
        "smtp_journal",
        str,
        None,
        "Journal address: every SMTP send also goes to a subaddress of it (journal+<tag>@domain, the tag secret "
        "to each step) as one more envelope recipient (RCPT TO only, never a header; recipients cannot see it), so "
        "EVQ_JOURNAL_IMAP_URL can find the copy of a send whose answer was lost. Its mailbox must accept "
        "+subaddresses and record the envelope recipient (Delivered-To or X-Original-To).",
    ),
    Option(
        "smtp_relay",
        str,
        "none",
        "The SMTP server is this provider's relay: sendgrid, mailgun, postmark or ses (none: a plain server). "
        "Each message then carries the relay's metadata header with the step's evq_key tag (the key's digest and part of the Message-ID's), which its "
        "webhooks echo: X-SMTPAPI, X-Mailgun-Variables, X-PM-Metadata-evq_key or X-SES-MESSAGE-TAGS.",
        choices=RELAYS,
    ),
)

# The witness of the SMTP adapter (adapters/smtp/journal.py): the IMAP mailbox the journal
# copies land in (or the relay's own archive), searched by Message-ID to settle unknown rows.
JOURNAL_OPTIONS: tuple[Option, ...] = (
    Option(
        "journal_imap_url",
        str,
        None,
        "IMAP mailbox the reconciler searches by Message-ID to settle unknown SMTP steps: "
        "imaps://user@host:993/MAILBOX (TLS) or imap://user@host:143/MAILBOX (STARTTLS, required); unset: none.",
    ),
    Option("journal_imap_password", str, None, "Password of EVQ_JOURNAL_IMAP_URL's user (never logged).", secret=True),
    Option(
        "journal_imap_ca_file",
        str,
        None,
        "PEM bundle of the CA(s) trusted for the journal IMAP server's certificate; unset: the system's trust store.",
    ),
    Option(
        "journal_imap_timeout", float, 10.0, "Seconds for one whole journal lookup (connect to logout).", minimum=0.1
    ),
)

_OPTION = {o.name: o for o in (*OPTIONS, *JOURNAL_OPTIONS)}
# An address evq can put in RCPT TO as it is: ASCII, no quoting, no route.
_JOURNAL_ADDRESS = re.compile(
    r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$"
)
IMAP_SCHEMES = {"imaps": 993, "imap": 143}


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
    journal: str | None = None
    relay: str = "none"

    def validate(self) -> None:
        """The checks between these options, and the TLS files read now: a bad bundle or key
        fails at startup with its setting named, not as every send's TLS failure."""
        if self.journal is not None and not _JOURNAL_ADDRESS.match(self.journal):
            raise bad(
                _OPTION["smtp_journal"],
                f"must be a plain ASCII address such as journal@example.org, got {self.journal!r}",
            )
        if self.journal is not None and len(self.journal.rsplit("@", 1)[0]) > MAX_JOURNAL_LOCAL:
            # Each step's copy goes to local+<tag>@domain (adapters/smtp/witness.py), within
            # RFC 5321's 64 characters for a local part.
            raise bad(
                _OPTION["smtp_journal"],
                f"needs a local part of at most {MAX_JOURNAL_LOCAL} characters: each send's copy goes to "
                f"its subaddress local+<{TAG_HEX}-character tag>@domain",
            )
        if self.journal is not None and self.relay != "none":
            # Through a relay the journal address is one more recipient of the relay's transaction,
            # with the same evq_key: the relay's events for it (a bounce) would land on the step.
            # A relay's webhooks already settle a lost answer; the journal is plain SMTP's witness.
            raise bad(
                _OPTION["smtp_journal"],
                f"cannot be used with EVQ_SMTP_RELAY={self.relay}: the relay's delivery events for the journal "
                "address would be taken for the step's; unset EVQ_SMTP_JOURNAL (the relay's webhooks settle "
                "lost answers)",
            )
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


@dataclass(frozen=True, slots=True)
class JournalImap:
    """Where the journal mailbox is, as EVQ_JOURNAL_IMAP_URL says."""

    tls: str  # "ssl" (imaps://) or "starttls" (imap://)
    host: str
    port: int
    user: str
    mailbox: str


@dataclass(frozen=True, slots=True)
class JournalConfig:
    """The EVQ_JOURNAL_IMAP_* options without their prefix."""

    url: str | None = None
    password: str | None = None
    ca_file: str | None = None
    timeout: float = 10.0

    def validate(self) -> None:
        if self.url is None:
            for name in ("password", "ca_file"):
                if getattr(self, name) is not None:
                    raise bad(_OPTION["journal_imap_" + name], "needs EVQ_JOURNAL_IMAP_URL")
            return
        self.where()
        if not self.password:
            raise bad(_OPTION["journal_imap_password"], "must be set with EVQ_JOURNAL_IMAP_URL")
        if not self.password.isascii() or any(c in self.password for c in "\r\n\0"):
            # IMAP LOGIN sends it as a quoted string: ASCII without line breaks (never echoed here).
            raise bad(_OPTION["journal_imap_password"], "must be ASCII without line breaks")
        if self.ca_file is not None:
            if not os.path.isfile(self.ca_file):
                raise bad(_OPTION["journal_imap_ca_file"], f"names no readable file: {self.ca_file!r}")
            try:
                ssl.create_default_context(cafile=self.ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise bad(_OPTION["journal_imap_ca_file"], f"cannot be loaded as a PEM CA bundle: {exc}") from None

    def where(self) -> JournalImap:
        """The URL's parts; a password in the URL is refused (it would be shown wherever the URL is)."""
        option = _OPTION["journal_imap_url"]
        assert self.url is not None
        try:
            parts = urlsplit(self.url)
            port = parts.port
        except ValueError as exc:
            raise bad(option, f"is not a URL: {exc}") from None
        if parts.scheme not in IMAP_SCHEMES:
            raise bad(option, "must start with imaps:// (TLS) or imap:// (STARTTLS); plain IMAP is not offered")
        if parts.password is not None:
            raise bad(option, "must not carry the password: set EVQ_JOURNAL_IMAP_PASSWORD")
        if not parts.hostname or not parts.username:
            raise bad(option, "must name the user and the host: imaps://user@host:993/MAILBOX")
        if parts.query or parts.fragment:
            raise bad(option, "takes no query or fragment")
        mailbox = unquote(parts.path.lstrip("/")) or "INBOX"
        user = unquote(parts.username)
        for what, value in (("user", user), ("mailbox", mailbox)):
            if not value.isascii() or any(c < " " or c == "\x7f" for c in value):
                raise bad(option, f"{what} must be printable ASCII, got {value!r}")
        return JournalImap(
            tls="ssl" if parts.scheme == "imaps" else "starttls",
            host=parts.hostname,
            port=port or IMAP_SCHEMES[parts.scheme],
            user=user,
            mailbox=mailbox,
        )


def profile(config: SmtpConfig, webhooks: Collection[str] = (), *, witness: bool = False) -> ProviderProfile:
    """What this provider can do to settle a lost answer (docs/design.md, "Provider profiles"),
    from the settings alone. A plain SMTP server: nothing (no key it honours, no webhook), but a
    lookup by Message-ID when a journal mailbox is its ``witness`` (EVQ_JOURNAL_IMAP_URL,
    adapters/smtp/journal.py). Through a relay (EVQ_SMTP_RELAY) whose webhook is configured
    (``webhooks``, the webhook providers whose secret is set, names it): that relay's events."""
    events = RELAY_EVENTS.get(config.relay, ()) if set(reported_by(config)) & set(webhooks) else ()
    return ProviderProfile(dedupe_window=None, lookup_by=("message_id",) if witness else (), webhook_events=events)


def reported_by(config: SmtpConfig) -> tuple[str, ...]:
    """The webhook providers whose events can be about a message this adapter sent: the relay
    (EVQ_SMTP_RELAY) only; a plain SMTP server has none. Settings.webhook_step_providers joins these."""
    return (config.relay,) if config.relay in RELAY_EVENTS else ()
