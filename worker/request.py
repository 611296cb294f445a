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

The checks it is built from live beside it, by what they check: worker/field_checks.py (one
field: strings, text, errors), worker/header_text.py (control characters and RFC 2047 words),
worker/addresses.py (one address), worker/domains.py (domain forms, allowed and blocked
domains) and worker/reserved_senders.py (senders reserved for evq's own notices).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from evq.worker.addresses import address_list, each_recipient, single_address
from evq.worker.approval_policy import PRIORITIES, ApprovalPolicy
from evq.worker.domains import domain_refusal
from evq.worker.errors import InvalidRequest
from evq.worker.field_checks import (
    FieldErrors,
    PrefixedErrors,
    encodable,
    string_field,
    text_field,
    timestamp,
    type_name,
)
from evq.worker.header_text import CONTROL, CONTROL_OR_TAB, encoded_word_refusal
from evq.worker.jsontext import bad_numbers
from evq.worker.reserved_senders import is_reserved, name_impersonates

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
MAX_INTENT = 2_000
MAX_DECISION_TEXT = 200
MAX_RATIONALE_BYTES = 64 * 1024
MAX_JSON_DEPTH = 16
# How far ahead a send may be scheduled (send_at).
MAX_SEND_AHEAD = timedelta(days=365)

_PROVIDER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


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


def parse(data: Any, policy: Policy = Policy()) -> ValidRequest:
    """Validate and normalize one request; raise InvalidRequest naming every bad field."""
    errors = FieldErrors()
    if not isinstance(data, Mapping):
        raise InvalidRequest([{"field": "$", "message": f"expected a JSON object, got {type_name(data)}"}])
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
    sender = single_address(data, "from", errors, default=policy.default_from, internal=internal)
    if sender and is_reserved(sender["email"], policy.reserved_senders):
        errors.add("from", "this sender is reserved for evq's own notices")
    elif sender and name_impersonates(sender["name"], policy.reserved_senders):
        errors.add("from", "this display name shows a sender reserved for evq's own notices")
    to = address_list(data, "to", errors, internal)
    cc = address_list(data, "cc", errors, internal)
    bcc = address_list(data, "bcc", errors, internal)
    reply_to = address_list(data, "reply_to", errors, internal)
    notify_addr = single_address(data, "notify", errors, default=None, internal=internal)
    recipients = to + cc + bcc
    if not to and not any(e["field"].startswith("to") for e in errors.items):
        errors.add("to", "at least one recipient is required")
    if len(recipients) > policy.max_recipients:
        errors.add("to", f"{len(recipients)} recipients exceed the limit of {policy.max_recipients}")
    for where, addr in each_recipient(to, cc, bcc):
        refusal = domain_refusal(addr["email"], policy)
        if refusal:
            errors.add(where, refusal)
    # The failure notice goes to notify through the same policy: refused here, not silently at send.
    if notify_addr and (refusal := domain_refusal(notify_addr["email"], policy)):
        errors.add("notify", refusal)

    subject = text_field(data, "subject", errors, required=True, limit=MAX_SUBJECT, single_line=True)
    text = text_field(data, "text", errors, required=False, limit=None, single_line=False)
    html = text_field(data, "html", errors, required=False, limit=None, single_line=False)
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
        errors.add("require_approval", f"must be true or false, got {type_name(require_approval)}")
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


def _identifier(data: Mapping[str, Any], name: str, errors: FieldErrors, *, required: bool) -> str | None:
    value = string_field(data, name, errors, required=required)
    if value is None:
        return None
    if not value or value != value.strip():
        errors.add(name, "must be non-empty without leading or trailing spaces")
        return None
    if len(value) > MAX_IDENTIFIER:
        errors.add(name, f"longer than {MAX_IDENTIFIER} characters")
        return None
    if CONTROL_OR_TAB.search(value) or not value.isprintable():
        errors.add(name, "contains control or unprintable characters")
        return None
    return unicodedata.normalize("NFC", value)


def _headers(value: Any, errors: FieldErrors) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        errors.add("headers", f"must be an object of header name to value, got {type_name(value)}")
        return {}
    out: dict[str, str] = {}
    for raw_name, raw_value in value.items():
        canonical = ALLOWED_HEADERS.get(str(raw_name).lower())
        where = f"headers.{str(raw_name)[:60]}"
        if canonical is None:
            errors.add(where, f"header not allowed; allowed: {', '.join(sorted(ALLOWED_HEADERS.values()))}")
            continue
        if not isinstance(raw_value, str):
            errors.add(where, f"must be a string, got {type_name(raw_value)}")
            continue
        if CONTROL.search(raw_value):
            errors.add(where, "CR, LF and control characters are not allowed in a header")
            continue
        if not encodable(raw_value):  # half a UTF-16 pair (a JSON escape) is no text to send or store
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


def _decision(data: Mapping[str, Any], errors: FieldErrors) -> Decision:
    intent = text_field(data, "intent", errors, required=False, limit=MAX_INTENT, single_line=False)
    raw = data.get("decision")
    if raw is None:
        return Decision(intent=intent)
    if not isinstance(raw, Mapping):
        errors.add("decision", f"must be an object, got {type_name(raw)}")
        return Decision(intent=intent)
    for key in raw:
        if key not in DECISION_FIELDS:
            errors.add(f"decision.{str(key)[:60]}", "unknown field")
    short = {
        key: text_field(
            raw, key, PrefixedErrors(errors, "decision."), required=False, limit=MAX_DECISION_TEXT, single_line=True
        )
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
        parsed_at = timestamp(decided_at)
        if parsed_at is None:
            errors.add("decision.decided_at", "must be an ISO 8601 timestamp with a time zone")
    return Decision(intent=intent, rationale=rationale, decided_at=parsed_at, **short)


def _send_at(value: Any, errors: FieldErrors) -> datetime | None:
    """``send_at``: an ISO 8601 instant with its offset, at most MAX_SEND_AHEAD from now. A past
    one is kept as given (the enqueue starts it at its own now): a retry of a request made
    yesterday is the same request."""
    if value is None:
        return None
    parsed = timestamp(value)
    if parsed is None:
        errors.add("send_at", "must be an ISO 8601 timestamp with a time zone offset (2026-05-01T09:00:00+02:00)")
        return None
    if parsed - datetime.now(UTC) > MAX_SEND_AHEAD:
        errors.add("send_at", f"more than {MAX_SEND_AHEAD.days} days ahead")
        return None
    return parsed
