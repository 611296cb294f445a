"""Rendering a normalized payload as the RFC 5322 bytes and the envelope the SMTP adapter sends.

Nothing here talks to a server: :func:`build_message` either returns an
:class:`Envelope` whose bytes re-parse to exactly the headers it meant
(``_verify_rendered``), or raises :class:`BuildError` and nothing is sent.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email import policy as email_policy
from email.header import Header
from email.message import EmailMessage
from email.parser import BytesParser, Parser
from email.utils import format_datetime
from typing import Any

from email_validator import EmailNotValidError

from evq.worker.addresses import validate_address
from evq.worker.delivery import KEY_TAG, key_tag
from evq.worker.ports import SendRequest
from evq.worker.request import ALLOWED_HEADERS

_POLICY_7BIT = email_policy.SMTP.clone(cte_type="7bit")

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_MESSAGE_ID = re.compile(r"^<[!-;=?-~]+@[!-;=?-~]+>$")  # printable ASCII, no <, >, space
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\u0080-\U0010ffff-]+"
_DOT_ATOM = re.compile(rf"^{_ATEXT}(?:\.{_ATEXT})*$")
_PHRASE = re.compile(r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?: [A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*$")


# The metadata header each relay (EVQ_SMTP_RELAY) reads, which its webhooks echo; the relay
# takes it off before delivery (Mailgun's documentation says it keeps X-Mailgun-Variables in
# the delivered message: recipients can read the digest, never the key).
RELAY_HEADERS: dict[str, str] = {
    "sendgrid": "X-SMTPAPI",  # {"unique_args": {"evq_key": ...}}: SendGrid's SMTP API
    "mailgun": "X-Mailgun-Variables",  # {"evq_key": ...}: user variables, a JSON map
    "postmark": "X-PM-Metadata-" + KEY_TAG,  # the value: custom metadata named evq_key
    "ses": "X-SES-MESSAGE-TAGS",  # evq_key=...: message tags (letters, digits, _ and - only)
}


def relay_header(relay: str, idempotency_key: str, message_id: str) -> tuple[str, str] | None:
    """The relay's metadata header carrying ``evq_key`` = the step's tag (worker/delivery.py,
    ``key_tag``), as (name, value); None for ``none``. Derived from the key and the Message-ID:
    the same on every attempt, another for another installation's step with the same key."""
    if relay == "none":
        return None
    digest = key_tag(idempotency_key, message_id)
    if relay == "sendgrid":
        value = json.dumps({"unique_args": {KEY_TAG: digest}}, separators=(", ", ": "))
    elif relay == "mailgun":
        value = json.dumps({KEY_TAG: digest}, separators=(", ", ": "))
    elif relay == "postmark":
        value = digest
    elif relay == "ses":
        value = f"{KEY_TAG}={digest}"
    else:
        raise BuildError(f"unknown SMTP relay {relay!r}; known: none, {', '.join(RELAY_HEADERS)}")
    return RELAY_HEADERS[relay], value


def relay_key_digest(relay: str, value: str) -> str | None:
    """What a relay reads as ``evq_key`` from its header's (unfolded) value: the inverse of
    :func:`relay_header`, as the relay parses it; None if it would find none."""
    try:
        if relay == "sendgrid":
            found = json.loads(value).get("unique_args", {}).get(KEY_TAG)
        elif relay == "mailgun":
            found = json.loads(value).get(KEY_TAG)
        elif relay == "postmark":
            found = value.strip()
        elif relay == "ses":
            tags = dict(part.strip().partition("=")[::2] for part in value.split(","))
            found = tags.get(KEY_TAG)
        else:
            return None
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) and found else None


class BuildError(ValueError):
    """The payload cannot be rendered as a safe message; nothing was sent."""


@dataclass(frozen=True, slots=True)
class Envelope:
    sender: str
    recipients: tuple[str, ...]
    data: bytes
    smtputf8: bool


@dataclass(frozen=True, slots=True)
class _Addr:
    name: str
    local: str
    domain: str

    @property
    def spec(self) -> str:
        return f"{self.local}@{self.domain}"

    @property
    def needs_utf8(self) -> bool:
        return not self.local.isascii()


def build_message(
    request: SendRequest,
    *,
    now: datetime | None = None,
    internal_domains: tuple[str, ...] = (),
    relay: str = "none",
) -> Envelope:
    """Render the normalized payload as RFC 5322 bytes plus the SMTP envelope.

    Bcc recipients exist only in the envelope. The Message-ID is the step's, so every
    attempt carries the same one (invariant 1): a recipient's MTA can then discard a
    duplicate, and an operator can find the message by it. Nothing else of evq's goes
    into the message: the idempotency key (``run_id:step_id`` by default) names the
    caller's internal ids, which are none of the recipients' business. Through a relay
    (``relay``, EVQ_SMTP_RELAY) the relay's metadata header carries the step's tag (the key's
    SHA-256 digest and part of the Message-ID's: :func:`relay_header`), which the relay's
    webhooks echo.

    The header block is rendered here, not by ``email.message``: its folding drops
    the quotes around a long display name (``"Doe, John" <a@b>`` becomes two
    addresses) and writes RFC 2047 words it decoded back raw (CVE-2024-6923). The
    email package only renders the MIME body, whose headers are all ours.
    """
    payload = request.payload
    if not _MESSAGE_ID.match(request.message_id or ""):
        raise BuildError(f"step Message-ID {request.message_id!r} is not of the form <left@right>")
    sender = _addr(payload["from"], internal_domains)
    groups = {
        key: [_addr(a, internal_domains) for a in payload.get(key) or ()] for key in ("to", "cc", "bcc", "reply_to")
    }
    smtputf8 = any(a.needs_utf8 for a in (sender, *(a for group in groups.values() for a in group)))

    headers = [("From", _addresses([sender])), ("To", _addresses(groups["to"]))]
    if groups["cc"]:
        headers.append(("Cc", _addresses(groups["cc"])))
    if groups["reply_to"]:
        headers.append(("Reply-To", _addresses(groups["reply_to"])))
    headers.append(("Subject", _unstructured("Subject", payload.get("subject") or "")))
    headers.append(("Date", format_datetime(now or datetime.now(UTC))))
    headers.append(("Message-ID", request.message_id))
    metadata = relay_header(relay, request.idempotency_key, request.message_id)
    if metadata is not None:
        headers.append(metadata)
    ours = {name.lower() for name, _ in headers}
    for name, value in (payload.get("headers") or {}).items():
        canonical = ALLOWED_HEADERS.get(str(name).lower())
        if canonical is not None and canonical.lower() not in ours:
            headers.append((canonical, _unstructured(canonical, str(value))))

    body = _body(payload.get("text"), payload.get("html"))
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    try:
        data = head.encode("utf-8" if smtputf8 else "ascii") + body.as_bytes()
    except UnicodeEncodeError as exc:
        raise BuildError("a header would need SMTPUTF8 although no address does") from exc
    _verify_rendered(data, smtputf8, [name for name, _ in headers] + list(body.keys()), groups, sender)
    if metadata is not None:
        _verify_relay_header(data, smtputf8, relay, key_tag(request.idempotency_key, request.message_id))

    recipients: list[str] = []
    seen: set[str] = set()
    for a in (*groups["to"], *groups["cc"], *groups["bcc"]):
        if a.spec.lower() not in seen:
            seen.add(a.spec.lower())
            recipients.append(a.spec)
    return Envelope(sender=sender.spec, recipients=tuple(recipients), data=data, smtputf8=smtputf8)


def _addr(entry: Mapping[str, Any], internal_domains: tuple[str, ...] = ()) -> _Addr:
    try:
        valid = validate_address(entry["email"], internal_domains)
    except (EmailNotValidError, KeyError, TypeError, UnicodeError) as exc:
        raise BuildError(f"not a valid address: {entry.get('email')!r}") from exc
    # The ASCII (IDNA) domain works everywhere; only a non-ASCII local part needs SMTPUTF8.
    return _Addr(name=_one_line(entry.get("name") or ""), local=valid.local_part, domain=valid.ascii_domain)


def _one_line(value: str) -> str:
    # The validator already refuses control characters; this is the second line of
    # defence for rows written by something else: a CR/LF never reaches a header.
    return _CONTROL.sub(" ", value).strip()


def _addresses(addrs: list[_Addr]) -> str:
    # One address per line, so no folding decision can ever split inside one.
    return ",\r\n ".join(_address(a) for a in addrs)


def _address(a: _Addr) -> str:
    local = a.local if _DOT_ATOM.match(a.local) else _quoted(a.local)
    if not a.name:
        return f"{local}@{a.domain}"
    if _PHRASE.match(a.name) and "=?" not in a.name:
        phrase = a.name
    elif a.name.isascii():
        # A quoted-string: commas, angle brackets, quotes and "Bcc:" stay text.
        phrase = _quoted(a.name)
    else:
        phrase = _encoded_words(a.name)
    return f"{phrase} <{local}@{a.domain}>"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unstructured(name: str, value: str) -> str:
    value = _one_line(value)
    # ASCII folds at spaces; anything else (or an unbreakable run that would pass the
    # 998-octet line limit) goes as RFC 2047 words, which fold anywhere.
    if value.isascii() and all(len(word) < 900 for word in value.split()):
        return Header(value, "us-ascii", header_name=name).encode(splitchars=" ", linesep="\r\n")
    return _encoded_words(value)


def _encoded_words(text: str) -> str:
    """RFC 2047 base64 words of at most 75 characters, one per line.

    Written here because ``email.header.Header`` doubles the space where it splits a
    long value. RFC 2047 decoders ignore the folding between adjacent words, so these
    concatenate back to exactly ``text``; splitting just after a space, where one is
    near, keeps words whole for the decoders (Python's among them, in a display name)
    that show that folding as a space.
    """
    chunks, chunk = [], ""
    for char in text:
        if len((chunk + char).encode()) > 45:  # 45 octets -> 60 base64 characters + 12 of syntax
            cut = chunk.rfind(" ") + 1
            if cut <= len(chunk) // 2:
                cut = len(chunk)
            chunks.append(chunk[:cut])
            chunk = chunk[cut:]
        chunk += char
    chunks.append(chunk)
    return "\r\n ".join(f"=?utf-8?b?{base64.b64encode(c.encode()).decode()}?=" for c in chunks)


def _body(text: str | None, html: str | None) -> EmailMessage:
    # Quoted-printable/base64 so no server needs 8BITMIME for the body.
    body = EmailMessage(policy=_POLICY_7BIT)
    if text is not None:
        body.set_content(text)
        if html is not None:
            body.add_alternative(html, subtype="html")
    elif html is not None:
        body.set_content(html, subtype="html")
    else:
        raise BuildError("a text or html body is required")
    return body


def _verify_rendered(
    data: bytes, smtputf8: bool, names: list[str], groups: dict[str, list[_Addr]], sender: _Addr
) -> None:
    """Parse what we are about to send and insist it says what we meant.

    A second, independent check on the rendering above: the same header names in the
    same order, the same addresses in From/To/Cc/Reply-To, no Bcc, and no control
    character in any header even after RFC 2047 decoding (a recipient's software may
    decode ``=?utf-8?q?=0D=0ABcc:...?=`` and re-serialize it as a real header).
    """
    try:
        if smtputf8:
            parsed = Parser(policy=email_policy.default).parsestr(data.decode("utf-8"), headersonly=True)
        else:
            parsed = BytesParser(policy=email_policy.default).parsebytes(data, headersonly=True)
        if [k.lower() for k in parsed.keys()] != [k.lower() for k in names]:
            raise BuildError("a display name, subject or header value would add or hide a header")
        expected = {"from": [sender], "to": groups["to"], "cc": groups["cc"], "reply-to": groups["reply_to"]}
        for header, addrs in expected.items():
            rendered = parsed[header].addresses if header in parsed else ()
            got = [(a.username, a.domain.lower()) for a in rendered]
            if got != [(a.local, a.domain.lower()) for a in addrs]:
                raise BuildError(f"a display name would change the {header} addresses")
        for name, value in parsed.items():
            if _CONTROL.search(str(value)):
                raise BuildError(f"the {name} header would carry control characters once decoded")
    except BuildError:
        raise
    except (ValueError, TypeError, UnicodeError) as exc:
        # The parser itself refuses, e.g. a display name that decodes to CR/LF.
        raise BuildError("a header would carry control characters once decoded") from exc


def _verify_relay_header(data: bytes, smtputf8: bool, relay: str, digest: str) -> None:
    """The relay's header, parsed back from the bytes about to be sent, carries exactly one
    ``evq_key``, the step's digest: otherwise its webhooks could not name the step."""
    parsed = (
        Parser(policy=email_policy.default).parsestr(data.decode("utf-8"), headersonly=True)
        if smtputf8
        else BytesParser(policy=email_policy.default).parsebytes(data, headersonly=True)
    )
    values = parsed.get_all(RELAY_HEADERS[relay]) or []
    if len(values) != 1 or relay_key_digest(relay, str(values[0])) != digest:
        raise BuildError(f"the {RELAY_HEADERS[relay]} header would not carry the key's digest")
