"""The send request: one parser and validator for every interface.

Python, CLI, HTTP and MCP all hand a plain mapping to :func:`parse`, which either
returns a :class:`ValidRequest` (normalized, canonical, hashed) or raises
:class:`~worker.errors.InvalidRequest` listing every failing field. Nothing is
written before this succeeds (invariant 6), and the provider adapter re-checks the
normalized payload with :func:`check_payload` before it sends.

Addresses are parsed strictly: a list entry is one address, either ``addr@domain``,
``Name <addr@domain>`` or ``{"email": ..., "name": ...}``. A display name is kept
as data and quoted when the message is rendered, so commas, angle brackets and
CR/LF in it can never smuggle a recipient or a header.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, TypedDict

from email_validator import EmailNotValidError, validate_email
from email_validator.rfc_constants import CASE_INSENSITIVE_MAILBOX_NAMES, DOT_ATOM_TEXT

from evq.worker.approval_policy import PRIORITIES, ApprovalPolicy
from evq.worker.errors import InvalidRequest
from evq.worker.jsontext import bad_numbers

REQUEST_FIELDS = (
    "run_id",
    "step_id",
    "to",
    "cc",
    "bcc",
    "from",
    "reply_to",
    "subject",
    "text",
    "html",
    "headers",
    "intent",
    "decision",
    "notify",
    "idempotency_key",
    "provider",
    "max_attempts",
    # Outside the payload, like max_attempts and notify: not part of payload_sha256 (how the
    # send is gated and scheduled is not what is sent).
    "require_approval",
    "send_at",
    "priority",
)
DECISION_FIELDS = ("instruction_version", "prompt_version", "model", "tool", "rationale", "decided_at")

# Headers a caller may set. Everything that shapes delivery (From, To, Subject,
# Message-ID, Date, MIME structure) is ours; these only thread or label a message.
ALLOWED_HEADERS = {
    name.lower(): name
    for name in (
        "In-Reply-To",
        "References",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
        "Auto-Submitted",
        "Keywords",
        "Comments",
    )
}

MAX_IDENTIFIER = 200
# Step ids and idempotency keys evq writes for its own steps start with this.
RESERVED_PREFIX = "evq:"
# The local part failure notices are sent from unless EVQ_NOTICE_FROM says otherwise.
NOTICE_LOCAL_PART = "evq-notices"
MAX_SUBJECT = 998  # RFC 5322 line limit
MAX_HEADER_VALUE = 998
MAX_NAME = 200
MAX_INTENT = 2_000
MAX_DECISION_TEXT = 200
MAX_RATIONALE_BYTES = 64 * 1024
MAX_JSON_DEPTH = 16
# How far ahead a send may be scheduled (send_at).
MAX_SEND_AHEAD = timedelta(days=365)

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")  # tab allowed
_CONTROL_OR_TAB = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_PROVIDER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_ANGLE_FORM = re.compile(r"^(?P<name>[^<>]*)<(?P<addr>[^<>]+)>$")


@dataclass(frozen=True, slots=True)
class Policy:
    """What this installation accepts; built from settings (EVQ_ALLOWED_DOMAINS, ...)."""

    max_message_bytes: int = 1024 * 1024
    max_recipients: int = 50
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    default_from: str | None = None
    default_provider: str = "smtp"
    providers: tuple[str, ...] = ("smtp",)
    # Addresses only evq itself may send from (failure notices); outside callers are refused.
    # An entry ending in "@" reserves that local part at every domain. The default reserves
    # the default notice sender, so a caller of the Python API that passes no policy cannot
    # send as evq either; Settings.policy() reserves the configured one (EVQ_NOTICE_FROM).
    reserved_senders: tuple[str, ...] = (NOTICE_LOCAL_PART + "@",)
    # Special-use domains (RFC 6761 and kin: .test, .local, .localhost, ...) that this
    # installation really delivers to, e.g. ("corp.local",): the address validator
    # refuses every other special-use domain, which no public mail server accepts.
    internal_domains: tuple[str, ...] = ()
    # Decision fields (DECISION_FIELDS) every request must carry (EVQ_REQUIRE_PROVENANCE), so
    # no step can be written whose decision does not say which model, under which instructions,
    # asked for it. Missing ones are field errors ("decision.model"), like any other.
    require_provenance: tuple[str, ...] = ()
    # Providers whose profile (worker/ports/providers.py, ProviderProfile.resolvable) could
    # never settle a send whose answer was lost: no dedupe, no lookup, no webhook. The
    # enqueue side fills it from the settings (ops/settings.py, Settings.policy()); a step
    # through one is flagged at enqueue (worker/enqueue.py, ``ambiguity``), or refused
    # (E_UNRESOLVABLE) with ``refuse_unresolvable`` (EVQ_REFUSE_UNRESOLVABLE).
    unresolvable: tuple[str, ...] = ()
    refuse_unresolvable: bool = False
    # Which sends wait for a person and the blast-radius budgets (worker/approval_policy.py;
    # EVQ_APPROVAL_*, EVQ_BUDGET_*). The default holds nothing but what a request asks for.
    approval: ApprovalPolicy = ApprovalPolicy()


@dataclass(frozen=True, slots=True)
class Decision:
    intent: str | None = None
    instruction_version: str | None = None
    prompt_version: str | None = None
    model: str | None = None
    tool: str | None = None
    rationale: Any = None
    decided_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Actor:
    """Who asked for a send: the API key's name and public id (never its secret), and
    the interface it came through. The Python API without ``api_key=`` has no key: ``key_id``
    is None and ``name`` is what the caller passed as ``actor=`` (maybe None). ``approval`` is
    the key's approval as read with the key for this call (worker/approval_policy.py, KeyApproval);
    a key without one is judged ``always`` (key_approval fails closed)."""

    interface: str  # cli, http, mcp, python
    key_id: str | None = None
    name: str | None = None
    approval: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"key_id": self.key_id, "name": self.name, "interface": self.interface}


@dataclass(frozen=True, slots=True)
class ValidRequest:
    run_id: str
    step_id: str
    idempotency_key: str
    provider: str
    payload: dict[str, Any]
    payload_json: str
    payload_sha256: str
    decision: Decision
    notify: str | None = None
    max_attempts: int | None = None
    sender_domain: str = field(default="localhost")
    # Set by the interface after the key is checked, never by the request itself.
    actor: Actor | None = None
    # The agent asked for a person's approval (worker/approval_policy.py, HoldRule.REQUESTED).
    require_approval: bool = False
    # Not before this instant (next_attempt_at starts there); None: now. A past one is now.
    send_at: datetime | None = None
    # One of worker/approval_policy.py's PRIORITIES.
    priority: str = "normal"

    @property
    def recipients(self) -> list[str]:
        return [a["email"] for key in ("to", "cc", "bcc") for a in self.payload[key]]


def canonical_json(value: Any) -> str:
    # allow_nan=False: jsonb has no NaN or Infinity, so they are refused before the database sees them.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def payload_digest(payload: Mapping[str, Any]) -> tuple[str, str]:
    text = canonical_json(payload)
    return text, hashlib.sha256(text.encode()).hexdigest()


def default_idempotency_key(run_id: str, step_id: str) -> str:
    return f"{run_id}:{step_id}"


class Address(TypedDict):
    """One address of a request's payload, as it is stored: normalized, with its display name."""

    email: str
    name: str | None


class _Errors:
    def __init__(self) -> None:
        self.items: list[dict[str, str]] = []

    def add(self, field_name: str, message: str) -> None:
        self.items.append({"field": field_name, "message": message})


def parse(data: Any, policy: Policy = Policy()) -> ValidRequest:
    """Validate and normalize one request; raise InvalidRequest naming every bad field."""
    errors = _Errors()
    if not isinstance(data, Mapping):
        raise InvalidRequest([{"field": "$", "message": f"expected a JSON object, got {_type_name(data)}"}])
    for key in data:
        if key not in REQUEST_FIELDS:
            errors.add(str(key)[:100], "unknown field")
    # A value parsed elsewhere (the Python API, MCP) may hold NaN, inf or a huge integer,
    # which jsonb refuses: named here rather than failing as the row is written.
    for where, why in bad_numbers(data):
        errors.add(where, why)

    run_id = _identifier(data, "run_id", errors, required=True)
    step_id = _identifier(data, "step_id", errors, required=True)
    key = _identifier(data, "idempotency_key", errors, required=False)
    for name, value in (("step_id", step_id), ("idempotency_key", key)):
        if value is not None and value.lower().startswith(RESERVED_PREFIX):
            # evq's own steps (failure notices) live there; a caller's step must never collide with one.
            errors.add(name, f"must not start with {RESERVED_PREFIX!r}: reserved for evq's own steps")
    if key is None and run_id and step_id:
        key = default_idempotency_key(run_id, step_id)

    internal = policy.internal_domains
    sender = _single_address(data, "from", errors, default=policy.default_from, internal=internal)
    if sender and _reserved(sender["email"], policy.reserved_senders):
        errors.add("from", "this sender is reserved for evq's own notices")
    elif sender and _name_impersonates(sender["name"], policy.reserved_senders):
        errors.add("from", "this display name shows a sender reserved for evq's own notices")
    to = _address_list(data, "to", errors, internal)
    cc = _address_list(data, "cc", errors, internal)
    bcc = _address_list(data, "bcc", errors, internal)
    reply_to = _address_list(data, "reply_to", errors, internal)
    notify_addr = _single_address(data, "notify", errors, default=None, internal=internal)
    recipients = to + cc + bcc
    if not to and not any(e["field"].startswith("to") for e in errors.items):
        errors.add("to", "at least one recipient is required")
    if len(recipients) > policy.max_recipients:
        errors.add("to", f"{len(recipients)} recipients exceed the limit of {policy.max_recipients}")
    for where, addr in _each_recipient(to, cc, bcc):
        refusal = _domain_refusal(addr["email"], policy)
        if refusal:
            errors.add(where, refusal)
    # The failure notice goes to notify through the same policy: refused here, not silently at send.
    if notify_addr and (refusal := _domain_refusal(notify_addr["email"], policy)):
        errors.add("notify", refusal)

    subject = _text(data, "subject", errors, required=True, limit=MAX_SUBJECT, single_line=True)
    text = _text(data, "text", errors, required=False, limit=None, single_line=False)
    html = _text(data, "html", errors, required=False, limit=None, single_line=False)
    if not text and not html and not any(e["field"] in ("text", "html") for e in errors.items):
        errors.add("text", "a text or html body is required")
    headers = _headers(data.get("headers"), errors)

    provider = data.get("provider", policy.default_provider)
    if not isinstance(provider, str) or not _PROVIDER.match(provider):
        errors.add("provider", "must be a provider name such as 'smtp'")
    elif provider not in policy.providers:
        errors.add("provider", f"unknown provider {provider!r}; configured: {', '.join(policy.providers)}")

    max_attempts = data.get("max_attempts")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or not 1 <= max_attempts <= 100
    ):
        errors.add("max_attempts", "must be an integer from 1 to 100")

    require_approval = data.get("require_approval", False)
    if require_approval is None:
        require_approval = False
    if not isinstance(require_approval, bool):
        errors.add("require_approval", f"must be true or false, got {_type_name(require_approval)}")
    send_at = _send_at(data.get("send_at"), errors)
    priority = data.get("priority")
    if priority is None:
        priority = "normal"
    if not isinstance(priority, str) or priority not in PRIORITIES:
        errors.add("priority", f"must be one of {', '.join(PRIORITIES)}")

    decision = _decision(data, errors)
    for name in policy.require_provenance:
        where = f"decision.{name}"
        given = getattr(decision, name)
        missing = given is None or (isinstance(given, str) and not given.strip())
        if missing and not any(e["field"] == where for e in errors.items):
            errors.add(where, "required by this installation (EVQ_REQUIRE_PROVENANCE)")

    payload = {
        "from": sender,
        "to": to,
        "cc": cc,
        "bcc": bcc,
        "reply_to": reply_to,
        "subject": subject,
        "text": text,
        "html": html,
        "headers": headers,
    }
    payload_json, digest = payload_digest(payload)
    size = len(payload_json.encode())
    if size > policy.max_message_bytes:
        errors.add("text", f"message is {size} bytes, over the limit of {policy.max_message_bytes}")
    if errors.items:
        raise InvalidRequest(errors.items)
    assert run_id and step_id and key and sender and subject is not None
    return ValidRequest(
        run_id=run_id,
        step_id=step_id,
        idempotency_key=key,
        provider=provider,
        payload=payload,
        payload_json=payload_json,
        payload_sha256=digest,
        decision=decision,
        notify=notify_addr["email"] if notify_addr else None,
        max_attempts=max_attempts,
        sender_domain=sender["email"].rsplit("@", 1)[1],
        require_approval=bool(require_approval),
        send_at=send_at,
        priority=priority,
    )


def check_payload(payload: Mapping[str, Any], policy: Policy = Policy()) -> str | None:
    """The adapter's re-check of a stored payload at send time; returns a refusal or None.

    Policy may have changed since enqueue (a domain newly blocked), and a row may have
    been written by something other than :func:`parse`; either way nothing leaves
    unless it passes today's rules. Reserved senders are a rule about who may ask,
    not about what may be sent: evq's own notices come from one.
    """
    request = {k: v for k, v in payload.items() if k in REQUEST_FIELDS}
    request.update(run_id="recheck", step_id="recheck")
    try:
        # Provenance is a rule about the request, checked when it was enqueued; a stored payload
        # holds no decision (and a step enqueued before the setting must still go out).
        parse(request, replace(policy, reserved_senders=(), require_provenance=()))
    except InvalidRequest as exc:
        return exc.message
    return None


# -- fields ------------------------------------------------------------------


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number" if isinstance(value, (int, float)) else type(value).__name__
    )


def _string(data: Mapping[str, Any], name: str, errors: _Errors, *, required: bool) -> str | None:
    """The field as a string; None (with an error where due) when absent or not a string."""
    value = data.get(name)
    if value is None:
        if required:
            errors.add(name, "required")
        return None
    if not isinstance(value, str):
        errors.add(name, f"must be a string, got {_type_name(value)}")
        return None
    return value


def _identifier(data: Mapping[str, Any], name: str, errors: _Errors, *, required: bool) -> str | None:
    value = _string(data, name, errors, required=required)
    if value is None:
        return None
    if not value or value != value.strip():
        errors.add(name, "must be non-empty without leading or trailing spaces")
        return None
    if len(value) > MAX_IDENTIFIER:
        errors.add(name, f"longer than {MAX_IDENTIFIER} characters")
        return None
    if _CONTROL_OR_TAB.search(value) or not value.isprintable():
        errors.add(name, "contains control or unprintable characters")
        return None
    return unicodedata.normalize("NFC", value)


# -- RFC 2047 encoded words ----------------------------------------------------
# Adapters encode text themselves, so a caller never needs an encoded word of its own; one
# could decode to CR/LF in a recipient's software and become a header (CVE-2024-6923).
# Decoders are more lenient than RFC 2047: Python's email.header and many mail clients
# decode a word with spaces inside, in an address, in any header. So anything that opens
# like one (=?charset?q? or =?charset?b?) is refused wherever it would become header text
# (subject, display names, addresses, header values); each word is decoded only to say why.
_ENCODED_WORD_START = re.compile(r"=\?[^?]*\?[bBqQ]\?")
_LENIENT_WORD = re.compile(r"=\?([^?]*)\?([bBqQ])\?(.*?)\?=", re.DOTALL)
# RFC 2047 section 2: token charset, no space or "?" in the text, at most 75 characters.
_STRICT_WORD = re.compile(r"=\?[!->@-~]+\?[bBqQ]\?[!->@-~]*\?=")
_BREAKS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]")


def encoded_word_refusal(value: str) -> str | None:
    """Why ``value`` may not become header text because of an encoded word, or None."""
    if not _ENCODED_WORD_START.search(value):
        return None
    words = list(_LENIENT_WORD.finditer(value))
    if any(_decodes_to_a_break(word) for word in words):
        return (
            "RFC 2047 encoded words are not allowed, and this one decodes to a line break or control character "
            "(a header injection)"
        )
    if not words or any(len(w[0]) > 75 or not _STRICT_WORD.fullmatch(w[0]) or _decoded(w) is None for w in words):
        return (
            "RFC 2047 encoded words (=?charset?q?...?=) are not allowed, malformed ones neither; send the text itself"
        )
    return "RFC 2047 encoded words (=?charset?q?...?=) are not allowed; send the text itself"


def header_text_refusal(value: str) -> str | None:
    """Why ``value`` may not be written as (part of) a header line, or None: CR, LF and other
    control characters, raw or inside an encoded word. The adapters' last check."""
    if _CONTROL.search(value):
        return "holds CR, LF or a control character"
    return encoded_word_refusal(value)


def _decoded(word: re.Match[str]) -> bytes | None:
    """The bytes an encoded word stands for, as a lenient decoder reads them; None if undecodable."""
    text = word[3]
    try:
        if word[2] in "bB":
            return base64.b64decode(re.sub(r"\s", "", text) + "===", validate=False)
        return re.sub(rb"=([0-9A-Fa-f]{2})", lambda m: bytes([int(m[1], 16)]), text.replace("_", " ").encode())
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None


def _decodes_to_a_break(word: re.Match[str]) -> bool:
    raw = _decoded(word)
    if raw is None:
        return False
    charset = word[1].split("*", 1)[0].strip() or "ascii"
    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:  # an unknown charset: what its ASCII bytes say is what a decoder shows
        text = raw.decode("latin-1")
    return bool(_BREAKS.search(text) or _BREAKS.search(raw.decode("latin-1")))


def _text(
    data: Mapping[str, Any], name: str, errors: _Errors, *, required: bool, limit: int | None, single_line: bool
) -> str | None:
    value = _string(data, name, errors, required=required)
    if value is None:
        return None
    if "\x00" in value:
        errors.add(name, "contains a NUL character")
        return None
    if single_line and _CONTROL.search(value):
        errors.add(name, "must be one line: CR, LF and control characters are not allowed")
        return None
    if single_line and (refusal := encoded_word_refusal(value)):
        errors.add(name, refusal)
        return None
    if limit is not None and len(value) > limit:
        errors.add(name, f"longer than {limit} characters")
        return None
    if required and not value.strip():
        errors.add(name, "must not be empty")
        return None
    if not _encodable(value):
        errors.add(name, "contains an unpaired surrogate")
        return None
    return unicodedata.normalize("NFC", value)


def _address(raw: Any, where: str, errors: _Errors, internal: tuple[str, ...] = ()) -> Address | None:
    name: Any = None
    if isinstance(raw, Mapping):
        extra = set(raw) - {"email", "name"}
        if extra:
            errors.add(where, f"unknown field(s) {sorted(map(str, extra))}")
            return None
        addr, name = raw.get("email"), raw.get("name")
        if not isinstance(addr, str):
            errors.add(where, "email must be a string")
            return None
        if name is not None and not isinstance(name, str):
            errors.add(where, "name must be a string")
            return None
    elif isinstance(raw, str):
        match = _ANGLE_FORM.match(raw.strip())
        if match:
            name = match["name"].strip()
            if len(name) >= 2 and name[0] == name[-1] == '"':
                name = name[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            addr = match["addr"].strip()
        else:
            addr = raw.strip()
    else:
        errors.add(where, f"must be an address string or {{email, name}} object, got {_type_name(raw)}")
        return None
    if name is not None:
        if _CONTROL_OR_TAB.search(name) or not _encodable(name):
            errors.add(where, "display name contains control characters or unpaired surrogates")
            return None
        if refusal := encoded_word_refusal(name):
            errors.add(where, f"display name: {refusal}")
            return None
        if len(name) > MAX_NAME:
            errors.add(where, f"display name longer than {MAX_NAME} characters")
            return None
        name = unicodedata.normalize("NFC", name.strip()) or None
    if refusal := encoded_word_refusal(addr):
        # Valid atext ("=?utf-8?q?=0D=0A?=@example.com"), and lenient decoders decode it anyway.
        errors.add(where, f"address: {refusal}")
        return None
    normalized, problem = _checked_address(addr, internal)
    if problem is not None:
        errors.add(where, f"not a valid address: {problem}")
        return None
    return {"email": normalized, "name": name}


@lru_cache(maxsize=8192)
def _checked_address(addr: str, internal: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """email_validator's verdict on one address (normalized form, or why not).

    A pure function of the string, and most of a request's validation time (IDNA
    tables): senders and recipients repeat, so each is checked once per process.
    Recipients often do not repeat while their domains do; :func:`_plain_address`
    then gives email_validator's answer from its cached verdict on the domain.
    """
    plain = _plain_address(addr)
    if plain is not None:
        return plain, None
    try:
        return validate_address(addr, internal).normalized, None
    except (EmailNotValidError, UnicodeError, ValueError) as exc:
        return "", str(exc)


# Appended to an internal domain for email_validator's syntax checks, then removed:
# its special-use list cannot be narrowed per call (and a module-wide change would
# open every special-use domain to every caller). "example" is not special to it.
_INTERNAL_SUFFIX = ".example"


@dataclass(frozen=True, slots=True)
class CheckedAddress:
    normalized: str
    local_part: str
    domain: str
    ascii_domain: str


def validate_address(addr: str, internal: tuple[str, ...] = ()) -> CheckedAddress:
    """email_validator's verdict on one address, with the operator's internal domains allowed.

    An address at an internal domain gets every other check (local part, label syntax,
    lengths, which the suffix makes at most a few octets stricter); only the
    special-use refusal is skipped, and only for the domains named."""
    domain = addr.rpartition("@")[2].strip().lower().rstrip(".")
    rules = (rule.strip().lstrip(".").lower() for rule in internal)
    if internal and any(rule and (domain == rule or domain.endswith("." + rule)) for rule in rules):
        valid = validate_email(addr + _INTERNAL_SUFFIX, check_deliverability=False)
        cut = len(_INTERNAL_SUFFIX)
        return CheckedAddress(valid.normalized[:-cut], valid.local_part, valid.domain[:-cut], valid.ascii_domain[:-cut])
    valid = validate_email(addr, check_deliverability=False)
    return CheckedAddress(valid.normalized, valid.local_part, valid.domain, valid.ascii_domain)


# The shape for which email_validator's result is the local part unchanged, "@", and
# its normalized domain: an unquoted ASCII dot-atom before the one @-sign (which it
# returns as given), and after it only hostname characters (so the split is the same
# as for any other local part). Everything else goes to email_validator whole.
_PLAIN_LOCAL = DOT_ATOM_TEXT
_HOSTNAME = re.compile(r"[a-zA-Z0-9.\-\u0080-\U0010FFFF]+\Z")
_MAX_ADDRESS_BYTES = 254  # RFC 3696 errata 1690, as email_validator checks it


def _plain_address(addr: str) -> str | None:
    """The normalized address when it has the plain shape and its domain is valid; else None."""
    local, at, domain = addr.partition("@")
    if not at or not _PLAIN_LOCAL.match(local) or not _HOSTNAME.match(domain):
        return None
    if local.lower() in CASE_INSENSITIVE_MAILBOX_NAMES:
        return None  # email_validator lowercases these: let it
    names = _checked_domain(domain)
    if names is None:
        return None  # let email_validator say why
    normalized = f"{local}@{names[0]}"
    # The three lengths email_validator checks; over the limit, it says by how much.
    for form in (addr, normalized, f"{local}@{names[1]}"):
        if len(form.encode()) > _MAX_ADDRESS_BYTES:
            return None
    return normalized


@lru_cache(maxsize=8192)
def _checked_domain(domain: str) -> tuple[str, str] | None:
    """email_validator's (normalized, ASCII) forms of a domain, or None if it refuses it."""
    try:
        checked = validate_email(f"a@{domain}", check_deliverability=False)
    except (EmailNotValidError, UnicodeError, ValueError):
        return None
    return checked.domain, checked.ascii_domain


def _address_list(data: Mapping[str, Any], name: str, errors: _Errors, internal: tuple[str, ...] = ()) -> list[Address]:
    value = data.get(name)
    if value is None:
        return []
    if isinstance(value, (str, Mapping)):
        value = [value]
    if not isinstance(value, list):
        errors.add(name, f"must be a list of addresses, got {_type_name(value)}")
        return []
    out = []
    for i, raw in enumerate(value[:1000]):
        addr = _address(raw, f"{name}[{i}]", errors, internal)
        if addr is not None:
            out.append(addr)
    if len(value) > 1000:
        errors.add(name, "too many addresses")
    return out


def notify_address(raw: Any, policy: Policy, field_name: str = "notify") -> str:
    """One address a notice may go to (a key's default target), checked as a request's
    ``notify`` is: one address, under the same domain rules. InvalidRequest otherwise."""
    errors = _Errors()
    addr = _address(raw, field_name, errors, policy.internal_domains)
    if addr and (refusal := _domain_refusal(addr["email"], policy)):
        errors.add(field_name, refusal)
    if errors.items or addr is None:
        raise InvalidRequest(errors.items or [{"field": field_name, "message": "not an email address"}])
    return addr["email"]


def _single_address(
    data: Mapping[str, Any], name: str, errors: _Errors, *, default: str | None, internal: tuple[str, ...] = ()
) -> Address | None:
    raw = data.get(name, default)
    if raw is None:
        if name == "from":
            errors.add("from", "required (or configure a default sender with EVQ_DEFAULT_FROM)")
        return None
    return _address(raw, name, errors, internal)


def _each_recipient(*lists: list[Address]) -> Iterator[tuple[str, Address]]:
    for list_name, items in zip(("to", "cc", "bcc"), lists, strict=True):
        for i, addr in enumerate(items):
            yield f"{list_name}[{i}]", addr


# Characters that read as a hyphen: every dash (Pd: U+2010 hyphen, U+2011 non-breaking hyphen,
# dashes) and the minus-like signs that are not dashes to Unicode. (A soft hyphen is invisible:
# a format character, dropped with the others.)
_HYPHEN_LIKE = frozenset("\u2212\u02d7\u2043\u2796\ufe63\uff0d")
# Letters of other scripts drawn like Latin ones (a subset of Unicode's confusables, UTS #39:
# Cyrillic, Greek, Armenian, Latin small capitals and IPA), so "\u0435vq-notices" (a Cyrillic
# "e") reads as evq's sender and is compared as it. Case matters here (Greek "\u039d" looks like
# "N", its lower case "\u03bd" like "v"), so they are mapped before case folding.
_LATIN_LOOK_ALIKES = str.maketrans(
    "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0423\u0425\u0405\u0406\u0408\u051a\u051c\u04ae\u04c0"
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0455\u0456\u0458\u04bb\u0501\u051b\u051d\u04af\u04cf\u0475\u0461\u04bd"
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7"
    "\u03b1\u03bf\u03c1\u03bd\u03b9\u03ba\u03c5\u03f2\u03f3"
    "\u0251\u0261\u0131\u0269\u1d04\u1d0f\u1d1c\u1d20\u1d21\u1d22\ua731"
    "\u0585\u0578\u057d\u0566\u0570",
    "ABEKMHOPCTYXSIJQWYIaeopcyxsijhdqwylvweABEZHIKMNOPTYXaopvikucjagiicouvwzsonuqh",
)


def look_alike(text: str) -> str:
    """The form in which two strings that look the same to a reader are equal: NFKC (fullwidth
    letters, compatibility forms), letters of other scripts drawn like Latin ones made Latin, case folded, every hyphen-like character a "-", and the
    invisible (format) characters gone."""
    folded = unicodedata.normalize("NFKC", text).translate(_LATIN_LOOK_ALIKES).casefold()
    out = []
    for ch in folded:
        category = unicodedata.category(ch)
        if category == "Pd" or ch in _HYPHEN_LIKE:
            out.append("-")
        elif category != "Cf":
            out.append(ch)
    return unicodedata.normalize("NFKC", "".join(out))


def _local_matches(local: str, reserved: str) -> bool:
    # A subaddress (RFC 5233: "evq-notices+anything") is the same mailbox, and reads as it.
    # Another local part that merely starts the same ("evq-notices-team") is another sender.
    return local.split("+", 1)[0] == reserved.split("+", 1)[0]


@lru_cache(maxsize=8192)  # senders repeat: a pure function of the strings
def _reserved(email: str, rules: tuple[str, ...]) -> bool:
    """Whether ``email`` is, or reads as, a reserved sender: case, Unicode look-alikes of the
    hyphen, fullwidth forms and a subaddress (``evq-notices+x@``) do not make it another sender."""
    local = look_alike(email).rpartition("@")[0]
    for rule in rules:
        rule_local, _, rule_domain = look_alike(rule).rpartition("@")
        if not _local_matches(local, rule_local):
            continue
        if not rule_domain or ascii_domain(email) == _ascii(rule_domain):
            return True
    return False


@lru_cache(maxsize=8192)
def _name_impersonates(name: str | None, rules: tuple[str, ...]) -> bool:
    """Whether a display name shows a reserved sender (``"evq-notices@host" <x@y>``): readers see
    the name, not the address. A rule for a local part at every domain is evq's own name, refused
    anywhere in a name; a rule for one address is refused as that local part followed by "@"."""
    if not name:
        return False
    shown = "".join(look_alike(name).split())
    for rule in rules:
        rule_local, _, rule_domain = look_alike(rule).rpartition("@")
        if rule_local and (rule_local + "@" in shown or (not rule_domain and rule_local in shown)):
            return True
    return False


def ascii_domain(email: str) -> str:
    return _ascii(email.rsplit("@", 1)[1])


@lru_cache(maxsize=8192)
def _ascii(domain: str) -> str:
    """The domain as a message is sent to it: email_validator's IDNA 2008 form, as the
    adapters use. Python's own "idna" codec is IDNA 2003, which maps ß, ς and joiners
    differently (straße.example -> strasse.example, not xn--strae-oqa.example): a domain
    rule checked in that form could be dodged, or could admit a different domain."""
    names = _checked_domain(domain)
    return names[1].lower() if names else domain.lower()


def unicode_domain(domain: str) -> str:
    """A domain as stored in a normalized address (Unicode, lower case), whichever form it is
    given in: ``xn--bcher-kva.example`` and ``BÜCHER.example`` are both ``bücher.example``.
    It is email_validator's normalized form, the one that normalized the stored addresses."""
    names = _checked_domain(domain)
    return names[0] if names else domain.lower()


def _domain_matches(domain: str, rule: str) -> bool:
    rule = _ascii(rule.strip().lstrip("."))  # a rule may be written in either form
    return domain == rule or domain.endswith("." + rule)


def _domain_refusal(email: str, policy: Policy) -> str | None:
    domain = ascii_domain(email)
    if any(_domain_matches(domain, rule) for rule in policy.blocked_domains):
        return f"recipient domain {domain} is blocked"
    if policy.allowed_domains and not any(_domain_matches(domain, rule) for rule in policy.allowed_domains):
        return f"recipient domain {domain} is not in the allowed domains"
    return None


def _headers(value: Any, errors: _Errors) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.add("headers", f"must be an object of header name to value, got {_type_name(value)}")
        return {}
    out: dict[str, str] = {}
    for raw_name, raw_value in value.items():
        canonical = ALLOWED_HEADERS.get(str(raw_name).lower())
        where = f"headers.{str(raw_name)[:60]}"
        if canonical is None:
            errors.add(where, f"header not allowed; allowed: {', '.join(sorted(ALLOWED_HEADERS.values()))}")
            continue
        if not isinstance(raw_value, str):
            errors.add(where, f"must be a string, got {_type_name(raw_value)}")
            continue
        if _CONTROL.search(raw_value):
            errors.add(where, "CR, LF and control characters are not allowed in a header")
            continue
        if not _encodable(raw_value):  # half a UTF-16 pair (a JSON escape) is no text to send or store
            errors.add(where, "contains an unpaired surrogate")
            continue
        if refusal := encoded_word_refusal(raw_value):
            errors.add(where, refusal)
            continue
        if len(raw_value) > MAX_HEADER_VALUE:
            errors.add(where, f"longer than {MAX_HEADER_VALUE} characters")
            continue
        if canonical in out:
            # Names are case-insensitive: "In-Reply-To" and "in-reply-to" are one header given twice.
            errors.add(where, f"{canonical} given twice (header names ignore case); give it once")
            continue
        out[canonical] = raw_value
    return out


def _json_depth(value: Any, depth: int = 0) -> int:
    if depth > MAX_JSON_DEPTH:
        return depth
    if isinstance(value, Mapping):
        return max((_json_depth(v, depth + 1) for v in value.values()), default=depth + 1)
    if isinstance(value, list):
        return max((_json_depth(v, depth + 1) for v in value), default=depth + 1)
    return depth


def _decision(data: Mapping[str, Any], errors: _Errors) -> Decision:
    intent = _text(data, "intent", errors, required=False, limit=MAX_INTENT, single_line=False)
    raw = data.get("decision")
    if raw is None:
        return Decision(intent=intent)
    if not isinstance(raw, Mapping):
        errors.add("decision", f"must be an object, got {_type_name(raw)}")
        return Decision(intent=intent)
    for key in raw:
        if key not in DECISION_FIELDS:
            errors.add(f"decision.{str(key)[:60]}", "unknown field")
    short = {
        key: _text(raw, key, _Prefixed(errors, "decision."), required=False, limit=MAX_DECISION_TEXT, single_line=True)
        for key in ("instruction_version", "prompt_version", "model", "tool")
    }
    rationale = raw.get("rationale")
    if rationale is not None:
        if not isinstance(rationale, (str, Mapping, list)):
            errors.add("decision.rationale", "must be text or a JSON object/array")
            rationale = None
        elif _json_depth(rationale) > MAX_JSON_DEPTH:
            errors.add("decision.rationale", f"nested deeper than {MAX_JSON_DEPTH} levels")
            rationale = None
        else:
            try:
                text = canonical_json(rationale)
                size = len(text.encode())
            except (TypeError, ValueError, UnicodeEncodeError):
                errors.add("decision.rationale", "is not JSON-serializable text")
                rationale = None
            else:
                if size > MAX_RATIONALE_BYTES:
                    errors.add("decision.rationale", f"larger than {MAX_RATIONALE_BYTES} bytes")
                    rationale = None
                elif "\\u0000" in text:
                    errors.add("decision.rationale", "contains a NUL character")
                    rationale = None
    decided_at = raw.get("decided_at")
    parsed_at = None
    if decided_at is not None:
        parsed_at = _timestamp(decided_at)
        if parsed_at is None:
            errors.add("decision.decided_at", "must be an ISO 8601 timestamp with a time zone")
    return Decision(intent=intent, rationale=rationale, decided_at=parsed_at, **short)


def _send_at(value: Any, errors: _Errors) -> datetime | None:
    """``send_at``: an ISO 8601 instant with its offset, at most MAX_SEND_AHEAD from now. A past
    one is kept as given (the enqueue starts it at its own now): a retry of a request made
    yesterday is the same request."""
    if value is None:
        return None
    parsed = _timestamp(value)
    if parsed is None:
        errors.add("send_at", "must be an ISO 8601 timestamp with a time zone offset (2026-05-01T09:00:00+02:00)")
        return None
    if parsed - datetime.now(UTC) > MAX_SEND_AHEAD:
        errors.add("send_at", f"more than {MAX_SEND_AHEAD.days} days ahead")
        return None
    return parsed


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


class _Prefixed(_Errors):
    """Adds a prefix to field names so nested objects report ``decision.model``."""

    def __init__(self, inner: _Errors, prefix: str):
        self.inner, self.prefix = inner, prefix

    def add(self, field_name: str, message: str) -> None:
        self.inner.add(self.prefix + field_name, message)
