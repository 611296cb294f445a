"""What an SMTP server's reply means, and what of it may be kept: the queue id of an accepted
message, the replies and failures that are a fault of the session or of our settings rather
than of the message (worker/circuit.py), and the forms of the password and of the journal
recipient that are scrubbed from every reply kept as evidence."""

from __future__ import annotations

import base64
import re
import smtplib
import ssl

# What a reply kept as evidence says in place of the journal recipient (never its address).
JOURNAL_SHOWN = "[journal]"

# Queue ids as the common MTAs phrase them: Postfix "queued as X", Exim "id=X",
# Sendmail "X Message accepted for delivery", Amazon SES "Ok <id>".
_QUEUE_ID = (
    re.compile(r"queued as\s+<?([A-Za-z0-9][A-Za-z0-9._:+/=@-]{0,127})", re.I),
    re.compile(r"\bid=<?([A-Za-z0-9][A-Za-z0-9._:+/=@-]{0,127})", re.I),
    re.compile(r"^(?:\d\.\d{1,3}\.\d{1,3}\s+)?([A-Za-z0-9]{8,64})\s+Message accepted for delivery", re.I),
    re.compile(r"^(?:\d\.\d{1,3}\.\d{1,3}\s+)?Ok\s+([0-9A-Za-z-]{20,128})\s*$", re.I),
)
# 5yz replies that mean "our configuration is wrong", not "this message is refused":
# authentication required / encryption required. Retrying after the operator fixes
# the settings sends the message; rejecting it would lose it.
CONFIG_CODES = frozenset({530, 538})
# The circuit fault (worker/circuit.py) of a 5yz refusal while setting up the session.
SESSION_FAULTS = {
    "connect": "greeting_refused",
    "ehlo": "greeting_refused",
    "starttls": "tls_failed",
    "auth": "auth_failed",
}
# A refusal of our HELO/EHLO name. Postfix (smtpd_delay_reject = yes, its default)
# gives it at RCPT time, for every recipient, as "504 5.5.2 <name>: Helo command
# rejected: need fully-qualified hostname": it reads like a refused recipient, but no
# message passes until the name is fixed (EVQ_SMTP_HELO_NAME).
_HELO_REFUSED = re.compile(r"\b(?:helo|ehlo)\b[^\n]{0,40}\b(?:rejected|refused|denied|invalid)\b", re.I)
# RFC 5321 §4.5.3.1.10: a server out of RCPTs for this transaction answers 452 (Postfix:
# "452 4.5.3 Error: too many recipients"); the rest go in a further transaction.
TOO_MANY = re.compile(r"(?:^|\s)4\.5\.3(?:\s|$)|too many recipients", re.I)


def queue_id(reply: str) -> str | None:
    """The server's queue id from a 2yz reply to the final ".", if it names one."""
    for line in reply.splitlines():
        for pattern in _QUEUE_ID:
            match = pattern.search(line.strip())
            if match:
                return match.group(1)
    return None


class Secrets:
    """The password and the encodings in which an AUTH exchange would carry it."""

    def __init__(self, username: str | None, password: str | None):
        forms: set[str] = set()
        if password:
            raw = password.encode()
            user = (username or "").encode()
            forms.add(password)
            for blob in (raw, b"\0" + user + b"\0" + raw, user + b"\0" + raw):
                forms.add(base64.b64encode(blob).decode())
        # Longest first, so a base64 form is replaced whole before a substring of it.
        self._forms = sorted((f for f in forms if len(f) >= 4), key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for form in self._forms:
            text = text.replace(form, "***")
        return text


def journal_forms(journal: str | None, tagged: str | None) -> list[re.Pattern[str]]:
    """What a server may echo of the journal recipient (the tagged address, the tag alone,
    the journal address), longest first, matched whatever the case."""
    if journal is None or tagged is None:
        return []
    tag = tagged.rsplit("@", 1)[0].rsplit("+", 1)[1]
    return [re.compile(re.escape(form), re.I) for form in (tagged, journal, tag)]


def helo_refused(code: int, reply: str, helo: str) -> bool:
    """Whether a 5yz reply refuses our HELO/EHLO name rather than the address it answers."""
    if not 500 <= code < 600:
        return False
    return bool(_HELO_REFUSED.search(reply)) or (bool(helo) and f"<{helo.lower()}>:" in reply.lower())


def is_temporary(code: int) -> bool:
    return not 500 <= code < 600 or code in CONFIG_CODES


def config_fault(code: int, reply: str) -> str | None:
    """A refusal of the session itself (worker/circuit.py): every message would get it."""
    if code in CONFIG_CODES:
        # 530 is "must issue STARTTLS" or "authentication required"; 538 wants TLS for AUTH.
        return "starttls_required" if code == 538 or "tls" in reply.lower() else "auth_failed"
    return None


def transport_fault(exc: BaseException, phase: str) -> str | None:
    """Nothing listening (refused) or a TLS handshake that fails: the provider, or our
    settings, not this message. A timeout or a reset stays an ordinary temporary failure."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) and phase == "connect":
            return "connection_refused"
        if isinstance(seen, ssl.SSLError):
            return "tls_failed"
        seen = seen.__cause__ or seen.__context__
    return None


def root_class(exc: BaseException) -> str:
    # smtplib wraps socket errors in SMTPServerDisconnected; the evidence should say
    # "TimeoutError" or "ConnectionResetError", which is what an operator acts on.
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and not isinstance(seen, smtplib.SMTPException):
            return type(seen).__name__
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


def short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
