"""The SMTP adapter's ``EVQ_SMTP_*`` options and the config built from them.

The one loader (ops/settings.py) reads these with every other option; ops/wiring.py
builds :class:`SmtpConfig` from it and the provider from that. Importing this module
costs nothing of the adapter itself (no smtplib), so every `evq` command can.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass

from evq.worker.options import Option, bad, boolean

# A HELO/EHLO name: a domain of at least two labels, or an RFC 5321 address literal.
_HELO_NAME = re.compile(
    r"^(?:(?=.{1,253}$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"|\[(?:\d{1,3}(?:\.\d{1,3}){3}|IPv6:[0-9A-Fa-f:.]+)\])$"
)

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
