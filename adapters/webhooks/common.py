"""What every provider's receiver shares: reading the body as JSON, the timestamp window,
Message-IDs, times, and the trimmed, scrubbed detail kept as evidence.

Nothing here echoes the peer's bytes into a refusal: a refusal names what was wrong in
evq's own words, so a forged request cannot put text in a log line or an answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from evq.worker.delivery import MESSAGE_TAG_HEX
from evq.worker.ports.webhooks import WebhookRefused
from evq.worker.secret_scrub import scrub

MAX_DEPTH = 32
MAX_EVENTS = 1000  # a SendGrid batch is at most a few hundred
_DIGEST = re.compile(rf"^[0-9a-f]{{64}}(-[0-9a-f]{{{MESSAGE_TAG_HEX}}})?$")
_TEXT_LIMIT = 500
_DETAIL_KEYS = 40


def unsigned(message: str = "no signature") -> WebhookRefused:
    return WebhookRefused(401, "unsigned", message)


def bad_signature(message: str = "the signature does not verify") -> WebhookRefused:
    return WebhookRefused(401, "bad_signature", message)


def malformed(message: str) -> WebhookRefused:
    return WebhookRefused(400, "malformed", message)


def replayed(message: str = "the timestamp is outside the tolerance") -> WebhookRefused:
    return WebhookRefused(401, "replayed", message)


# What PostgreSQL's text and jsonb refuse (NUL) and what UTF-8 cannot carry (a lone surrogate,
# which JSON's \ud800 escape can spell): stripped from anything stored, so the event is kept.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def clean(value: str) -> str:
    """``value`` without NULs and lone surrogates (signed text from a recipient's MTA may carry either)."""
    return _UNSTORABLE.sub("", value)


def utf8(value: str, what: str) -> bytes:
    """``value`` as UTF-8 bytes for a signature check, or ``malformed`` (a lone surrogate, which
    no provider signed: JSON can spell one, UTF-8 cannot)."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise malformed(f"{what} is not valid Unicode text") from None


def load_json(body: bytes) -> Any:
    """The body as JSON (UTF-8, at most :data:`MAX_DEPTH` deep), or ``malformed``."""
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise malformed("the body is not JSON") from None
    if _depth(value) > MAX_DEPTH:
        raise malformed("the body is nested too deeply")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = list(item.values()) if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_window(stamp: datetime, now: datetime, tolerance: float) -> None:
    """``replayed`` unless ``stamp`` is within ``tolerance`` seconds of ``now``, either way."""
    if abs((now - stamp).total_seconds()) > tolerance:
        raise replayed()


def unix_time(value: Any) -> datetime | None:
    """Seconds since the epoch (int, float or their text) as an aware time; None if it is not one."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    if not (0 <= seconds < 1e11):
        return None
    return datetime.fromtimestamp(seconds, UTC)


def iso_time(value: Any) -> datetime | None:
    """An ISO 8601 time (``Z`` allowed) as an aware time; None if it is not one."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)


def message_id(value: Any) -> str | None:
    """An RFC 5322 Message-ID as evq stores it, ``<local@domain>``; providers that drop the
    angle brackets (Mailgun, SendGrid's smtp-id sometimes) get them back. None if it is not one."""
    if not isinstance(value, str):
        return None
    text = clean(value).strip()
    if len(text) > 998:
        return None
    if not text.startswith("<"):
        text = f"<{text}>"
    inner = text[1:-1]
    if not text.endswith(">") or "@" not in inner or any(c in inner for c in "<> \t\r\n"):
        return None
    return text


def digest(value: Any) -> str | None:
    """An ``evq_key`` value (worker/delivery.py, ``key_tag``; a bare 64-hex digest from evq
    0.2.0's sends), or None (anything else is not ours)."""
    if isinstance(value, list) and len(value) == 1:  # SES tags are lists of values
        value = value[0]
    if isinstance(value, str) and _DIGEST.match(value.strip().lower()):
        return value.strip().lower()
    return None


def text(value: Any, limit: int = 320) -> str | None:
    """A short string from the peer, or None."""
    if not isinstance(value, str):
        return None
    return clean(value)[:limit] or None


def derived_id(provider: str, *parts: Any) -> str:
    """A deterministic event id for a provider that gives none: the same event twice is the same id."""
    joined = "\x1f".join("" if p is None else str(p) for p in parts)
    return f"{provider}:" + hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def detail(event: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The named fields of the provider's event, scalars trimmed and scrubbed: the evidence kept.
    Only named fields: never the message's content, headers or the peer's other data."""
    out: dict[str, Any] = {}
    for key in keys[:_DETAIL_KEYS]:
        value = event.get(key)
        if isinstance(value, str):
            out[key] = scrub(clean(value)[:_TEXT_LIMIT])
        elif isinstance(value, bool | int | float):
            out[key] = value
    return out


def headers_get(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value (names are lower-cased by the route), blank as None."""
    value = headers.get(name.lower())
    return value.strip() or None if isinstance(value, str) else None
