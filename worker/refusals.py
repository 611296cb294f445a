"""A refused enqueue as it is recorded (table ``enqueue_refusals``): bounded and scrubbed.

Operators need to see what agents tried and why it was refused, without evq keeping
what it refused: a refused request was never accepted for sending, so its body (the
recipients' addresses, the text, the html) has no business in the database. What is
kept of each refusal:

- when, through which interface (``cli``, ``http``, ``mcp``, ``python``), whether it was
  a dry run, and the API key's *name* (never the key; None when no valid key was shown);
- every failing field with its message (the first :data:`MAX_ERRORS`, each cut to a
  bounded length, registered secrets scrubbed) and how many there were in all;
- what was asked, as identifiers only: per request (the first :data:`MAX_ASKED`) its
  ``run_id``, ``step_id`` and ``provider`` when they are strings (cut short), the names
  of the fields it gave, and its recipient count;
- the SHA-256 and size of the canonical JSON of everything asked, so an agent's log
  can be matched to the row without the row holding the request.

``reasons`` are the failing fields' roots (``to[2]`` and ``[0].to`` are ``to``), the
label the database-wide counter ``evq_enqueue_refusals_total{interface,field}`` and the
per-process ``evq_validation_errors_total{reason}`` share.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evq.worker.logs import redact
from evq.worker.request import REQUEST_FIELDS

INTERFACES = ("cli", "http", "mcp", "python")
MAX_ERRORS = 50
MAX_ASKED = 10
MAX_FIELD = 100
MAX_MESSAGE = 300
MAX_IDENTIFIER = 80
MAX_KEYS = len(REQUEST_FIELDS) + 5

# "budget": an E_BUDGET refusal names the blast-radius budget (budget.<name>), not a field.
_REASONS = frozenset((*REQUEST_FIELDS, "$", "budget"))
_INDEX = re.compile(r"^\[\d+\]\.?")
# The shape worker/request.py accepts for a provider name.
_PROVIDER = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


def reason(field: str) -> str:
    """The root of a failing field as a metric label: a request field, ``$``, or ``unknown_field``."""
    root = _INDEX.sub("", field, count=1).split("[", 1)[0].split(".", 1)[0]
    return root if root in _REASONS else "unknown_field"


@dataclass(frozen=True, slots=True)
class Refusal:
    interface: str
    key_name: str | None
    dry_run: bool
    requests: int
    request_bytes: int
    request_sha256: str
    errors: list[dict[str, str]]
    error_count: int
    reasons: list[str]
    asked: list[dict[str, Any]]


def describe(
    interface: str,
    requests: Sequence[Any],
    errors: Sequence[Mapping[str, str]],
    *,
    key_name: str | None,
    dry_run: bool = False,
) -> Refusal:
    """The record of one refused call of ``requests`` (already parsed JSON, maybe not objects)."""
    if interface not in INTERFACES:
        raise ValueError(f"unknown interface {interface!r}")
    text = _digest_text(list(requests))
    kept = [
        {"field": _kept_field(str(e.get("field", ""))), "message": _cut(str(e.get("message", "")), MAX_MESSAGE)}
        for e in errors[:MAX_ERRORS]
    ]
    return Refusal(
        interface=interface,
        key_name=key_name,
        dry_run=dry_run,
        requests=len(requests),
        request_bytes=len(text),
        request_sha256=hashlib.sha256(text).hexdigest(),
        errors=kept,
        error_count=len(errors),
        reasons=sorted({reason(str(e.get("field", ""))) for e in errors}),
        asked=[_asked(r) for r in list(requests)[:MAX_ASKED]],
    )


def _kept_field(field: str) -> str:
    """A failing field's name as kept: an unknown field is whatever the caller wrote as a
    key (an address, a token), so only its kind is kept, like the counter's label."""
    if reason(field) == "unknown_field":
        return "(unknown field)"
    return _cut(field, MAX_FIELD)


def _digest_text(requests: list[Any]) -> bytes:
    """The canonical JSON of what was asked; a value JSON cannot hold (NaN, bytes) is its repr."""
    try:
        text = json.dumps(requests, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        text = repr(requests)
    return text.encode("utf-8", "surrogatepass")


def _asked(request: Any) -> dict[str, Any]:
    if not isinstance(request, Mapping):
        return {"type": type(request).__name__}
    out: dict[str, Any] = {}
    for name in ("run_id", "step_id"):
        value = request.get(name)
        if isinstance(value, str):
            out[name] = _cut(value, MAX_IDENTIFIER)
    provider = request.get("provider")
    if isinstance(provider, str):
        # A provider name is a short identifier; anything else is not kept verbatim.
        out["provider"] = provider if _PROVIDER.match(provider) else "(not a provider name)"
    # Known field names only: an unknown key is the caller's text, counted, not kept.
    keys = [str(k) for k in list(request)[:MAX_KEYS]]
    out["fields"] = sorted({k if reason(k) != "unknown_field" else "(unknown field)" for k in keys})
    out["recipients"] = sum(_count(request.get(name)) for name in ("to", "cc", "bcc"))
    return out


def _count(value: Any) -> int:
    if value is None:
        return 0
    return len(value) if isinstance(value, list) else 1


def _cut(text: str, limit: int) -> str:
    # Control characters would only garble a terminal's table; secrets never leave scrubbed.
    clean = "".join(ch if ch.isprintable() else "\ufffd" for ch in str(redact(text)))
    return clean if len(clean) <= limit else clean[: limit - 1] + "\u2026"
