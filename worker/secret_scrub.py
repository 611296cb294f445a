"""The one rule for secrets in text that evq did not write itself (invariant 7).

Every configured secret (SMTP password, HTTP provider key, database password, evq API
keys in use, the serve secret) is registered here once, and every text that came from
outside (a provider's answer, a library's exception, a log event) passes through
:func:`scrub` before it is stored, shown or logged. A peer rarely echoes a secret as
it was given: the Authorization header comes back as ``Bearer KEY``, in base64 (Basic
auth, AUTH PLAIN), URL-encoded, JSON-escaped (``\\/``, ``\\uXXXX``). So each secret is
registered with the forms those encodings give it, and one compiled pattern replaces
them all, longest first, so a longer form is never left half replaced.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, is_dataclass, replace
from functools import lru_cache
from operator import attrgetter
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "***"
# Very short values would redact ordinary words; real secrets are longer.
MIN_SECRET = 4

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None
# What tells whether a text holds a secret in any form, without the pattern: the forms that hold
# no shorter form (a text holding a form holds each form inside it), each looked for by str's own
# search (several times faster than the pattern's alternation, tried at every position; the
# pattern still does every replacement); and the texts already found to hold none of them, a
# bounded memo: most texts of a worker's log lines recur (their keys, the event, the run and the
# provider), and each is then searched once, not on every line. One tuple, replaced whole when a
# secret is registered, so the memo never outlives the forms it was checked against.
_detect: tuple[tuple[str, ...], dict[str, None]] = ((), {})
_CLEAN_MAX = 4096


def encoded_forms(secret: str) -> set[str]:
    """The secret as a peer may send it back."""
    forms = {secret, secret.lower(), secret.upper()}
    escaped = json.dumps(secret)[1:-1]
    forms |= {escaped, escaped.replace("/", "\\/"), json.dumps(secret, ensure_ascii=True)[1:-1]}
    # Every character escaped (some serializers do this for "unsafe" ones).
    forms.add("".join(f"\\u{ord(c):04x}" for c in secret))
    forms |= {quote(secret, safe=""), quote(secret), quote_plus(secret)}
    raw = secret.encode()
    # Basic auth ("user:secret", "secret:"), AUTH PLAIN ("\0user\0secret") and the bare
    # value, in the standard and URL-safe alphabets. base64 of a longer blob holds the
    # secret's base64 only when it starts on a 3-byte boundary, so each of the three
    # alignments of a prefix we do not know contributes its stable middle part.
    for blob in (raw, b":" + raw, raw + b":", b"\0" + raw):
        for enc in (base64.b64encode, base64.urlsafe_b64encode):
            text = enc(blob).decode()
            forms |= {text, text.rstrip("=")}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        # Drop the characters touched by the unknown prefix and by what follows.
        middle = encoded[(4 if shift else 0) : -4]
        if len(middle) >= 8:
            forms.add(middle)
            forms.add(middle.replace("+", "-").replace("/", "_"))
    return {f for f in forms if len(f) >= MIN_SECRET}


def register(values: Iterable[str | None]) -> None:
    global _pattern, _detect
    new = {v for v in values if v and len(v) >= MIN_SECRET} - _secrets
    if not new:
        return
    with _lock:
        _secrets.update(new)
        forms: set[str] = set()
        for secret in _secrets:
            forms |= encoded_forms(secret)
        minimal: list[str] = []
        for form in sorted(forms, key=len):
            if not any(shorter in form for shorter in minimal):
                minimal.append(form)
        # Before the pattern: a reader that sees the new pattern sees these forms too.
        _detect = (tuple(minimal), {})
        _pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


def _all_clean(texts: list[str], forms: tuple[str, ...], clean: dict[str, None]) -> bool:
    """Whether none of ``texts`` (not yet in ``clean``) holds any of ``forms``, as the pattern
    would find; when none does, they are remembered in ``clean``. One search of them joined: a
    form found in one text is found in the joined text too, and a match across two of them only
    answers False (the caller then scrubs the long way, which replaces nothing)."""
    text = "\n".join(texts)
    for form in forms:
        if form in text:
            return False
    if len(clean) > _CLEAN_MAX:
        clean.clear()
    clean.update(dict.fromkeys(texts))
    return True


def registered() -> frozenset[str]:
    return frozenset(_secrets)


def scrub_text(text: str) -> str:
    pattern = _pattern
    if pattern is None:
        return text
    return pattern.sub(REDACTED, text)


def scrub(value: Any) -> Any:
    """``value`` with every registered secret, in every form, replaced; containers deep."""
    if _pattern is None:
        return value
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Mapping):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(scrub(v) for v in value)
    if isinstance(value, BaseException):
        return scrub_text(str(value))
    return value


_PLAIN = (int, float, bool, type(None))
# The value types a log event's fast path takes: texts, searched, and numbers, which scrub() leaves
# as they are.
_FLAT = frozenset((str, int, float, bool, type(None)))


def scrub_event(event: Mapping[str, Any]) -> Any:
    """:func:`scrub` of a log event: the same result, sooner. Every line a worker logs on its hot
    path passes here, and nearly none holds a secret: when the event's keys are text and its values
    text and numbers only (scrub() leaves numbers as they are), the texts not already known to be
    clean are searched once, joined; the event goes the long way only when that finds a form."""
    if _pattern is None:
        return event
    forms, clean = _detect
    unseen: list[str] = []
    for key, value in event.items():
        if key not in clean:
            if type(key) is not str:
                return scrub(event)
            unseen.append(key)
        kind = type(value)
        if kind is str:
            if value not in clean:
                unseen.append(value)
        elif kind not in _FLAT:
            return scrub(event)
    if not unseen or _all_clean(unseen, forms, clean):
        return event
    return scrub(event)


def _flat_text(value: Any, out: list[str]) -> bool:
    """Append every text in ``value`` (strings, mapping keys and values, list items, deep) to
    ``out``; False when it holds anything else scrub() would change (an exception, say)."""
    kind = type(value)
    if kind is str:
        out.append(value)
        return True
    if kind in _PLAIN:
        return True
    if isinstance(value, Mapping):
        return all(_flat_text(k, out) and _flat_text(v, out) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_flat_text(v, out) for v in value)
    return False


@lru_cache(maxsize=64)
def _values_of(kind: Any) -> Callable[[Any], tuple[Any, ...]] | None:
    """A function giving a dataclass's field values as a tuple (one C call, not a getattr per
    field); None for a type that is no dataclass."""
    if not is_dataclass(kind):
        return None
    names = tuple(f.name for f in fields(kind))
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda record: (get(record),)
    return attrgetter(*names) if names else lambda _record: ()


def scrub_record(record: Any) -> Any:
    """A frozen dataclass (an outcome, a lookup result) with its text fields scrubbed. Every
    outcome passes here: when one search of all its texts joined finds no secret, the record
    is returned as it is, without a field-by-field copy."""
    pattern = _pattern
    if pattern is None:
        return record
    # type(record), not record: a dataclass itself (a class) is no record to scrub.
    kind: Any = type(record)
    values_of = _values_of(kind)
    if values_of is None:
        return record
    forms, clean = _detect
    texts: list[str] = []
    # The common outcome holds a few texts and an empty response: those are taken here, and
    # anything else is walked by _flat_text.
    for value in values_of(record):
        kind = type(value)
        if kind is str:
            if value not in clean:
                texts.append(value)
        elif kind in _PLAIN or (kind is dict and not value):
            continue
        elif not _flat_text(value, texts):
            break
    else:
        if not texts or _all_clean(texts, forms, clean):
            return record
    changes = {}
    for f in fields(record):
        value = getattr(record, f.name)
        if isinstance(value, (str, Mapping, list, tuple)):
            clean = scrub(value)
            if clean != value:
                changes[f.name] = clean
    return replace(record, **changes) if changes else record
