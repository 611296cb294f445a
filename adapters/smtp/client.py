"""The SMTP client a conversation (adapters/smtp/conversation.py) talks through: smtplib's,
except that a reply line counts only once it ended with CRLF; the name it greets with, the
message's bytes as DATA carries them, and the client TLS context."""

from __future__ import annotations

import re
import smtplib
import socket
import ssl
from functools import cache
from typing import Any


class IncompleteReply(smtplib.SMTPServerDisconnected):
    """A reply line that never reached its CRLF: the peer stopped mid-line, or evq's watchdog
    cut the exchange at the send's deadline while it trickled. It is no reply at all (RFC 5321
    §4.2: a reply line ends with CRLF); ``partial`` is what arrived of it."""

    def __init__(self, partial: bytes):
        super().__init__("the server's reply ended before its line end (CRLF)")
        self.partial = partial


class Smtp(smtplib.SMTP):
    """smtplib's reply reader, except that a line counts only once it ended with CRLF.

    smtplib takes whatever ``readline`` returns: at the end of the stream that is a partial
    line, so a reply cut at the deadline after "25" or "250 2.0.0 Ok: queued as X" would be
    read as a whole answer (code 250, or 222 from "2", "2", "2"...), and after the final "."
    a whole answer decides the outcome. A reply code is three digits here, never what
    ``int()`` makes of other bytes."""

    def getreply(self) -> tuple[int, bytes]:
        lines: list[bytes] = []
        if self.file is None:
            assert self.sock is not None
            self.file = self.sock.makefile("rb")
        while True:
            try:
                line = self.file.readline(smtplib._MAXLINE + 1)  # type: ignore[attr-defined]
            except OSError as exc:
                self.close()
                raise smtplib.SMTPServerDisconnected(f"Connection unexpectedly closed: {exc}") from exc
            if not line:
                self.close()
                raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")
            if not line.endswith(b"\r\n"):
                # The stream ended mid-line (or the line is longer than any reply may be).
                self.close()
                raise IncompleteReply(b"".join(lines) + line)
            lines.append(line)
            code = line[:3]
            if not (len(code) == 3 and code.isdigit()):
                # Unreadable: never a code, and no continuation line is read after it.
                return -1, b"\n".join(raw[4:].strip(b" \t\r\n") for raw in lines)
            if line[3:4] != b"-":
                return int(code), b"\n".join(raw[4:].strip(b" \t\r\n") for raw in lines)


class SmtpSsl(Smtp, smtplib.SMTP_SSL):
    """:class:`Smtp` over implicit TLS."""


@cache
def default_helo() -> str | None:
    """The host's FQDN when it has one; None: greet with our address literal instead.

    Most containers' names have no dot, and "localhost" (smtplib's fallback) is refused
    by any server with reject_non_fqdn_helo_hostname. RFC 5321 §4.1.4 offers the
    address literal of the connection when there is no name. Cached: smtplib would call
    getfqdn() (possibly a slow reverse lookup) on every connection."""
    fqdn = socket.getfqdn().strip(".")
    return fqdn if "." in fqdn and not fqdn.startswith("localhost.") else None


def address_literal(sockname: Any) -> str:
    """RFC 5321 §4.1.3 address literal of a local socket address: [192.0.2.1], [IPv6:2001:db8::1]."""
    host = str(sockname[0]).split("%", 1)[0]
    return f"[IPv6:{host}]" if ":" in host else f"[{host}]"


def dot_stuff(data: bytes) -> bytes:
    data = re.sub(rb"\r\n|\r|\n", b"\r\n", data)
    data = re.sub(rb"(?m)^\.", b"..", data)
    return data if data.endswith(b"\r\n") else data + b"\r\n"


def tls_context(
    ca_file: str | None = None, client_cert: str | None = None, client_key: str | None = None
) -> ssl.SSLContext:
    """The client TLS context: the system's trust store, or only ``ca_file`` (a private
    CA's bundle) when given; a client certificate for servers that ask for one. Always
    verifies the server's certificate and name: there is no setting to turn that off."""
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    if client_cert:
        context.load_cert_chain(client_cert, client_key or None)
    return context
