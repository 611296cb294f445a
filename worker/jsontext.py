"""JSON numbers evq can store (issue 13, "bad input that still gets through").

Python's json accepts NaN and Infinity, turns ``1e999`` into ``inf`` and raises a bare
ValueError for an integer over 4,300 digits; PostgreSQL's jsonb refuses the first
three, so each used to reach the database and come back as E_INTERNAL. Every entry
point parses with :func:`loads`, which never fails on such a number but marks it, and
then reports each one by its field path (``decision.rationale.score``); values that
arrive already parsed (the Python API, MCP's tool arguments) are checked with
:func:`bad_numbers`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

# jsonb holds far more, but no request needs an integer this long; Python's own limit
# (sys.get_int_max_str_digits, 4,300) would otherwise raise while parsing or dumping.
MAX_INT_DIGITS = 1000
WHY = "a number JSON cannot carry (NaN, Infinity, beyond ±1.8e308, or an integer over 1000 digits)"


class _Bad:
    """A number that was refused, kept as its text so the error can quote it."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text[:24] + ("..." if len(text) > 24 else "")


class BadNumbers(ValueError):
    """``fields`` is [(path, message)], one per refused number."""

    def __init__(self, fields: list[tuple[str, str]]):
        self.fields = fields
        super().__init__("; ".join(f"{path}: {message}" for path, message in fields))


def _float(text: str) -> Any:
    value = float(text)
    return value if math.isfinite(value) else _Bad(text)


def _int(text: str) -> Any:
    digits = len(text.lstrip("-"))
    return int(text) if digits <= MAX_INT_DIGITS else _Bad(text)


def loads(text: str | bytes, *, prefix: str = "") -> Any:
    """``json.loads``; raises BadNumbers naming every refused number's field (JSONDecodeError as usual)."""
    seen: list[_Bad] = []

    def mark(factory: Any) -> Any:
        def parse(token: str) -> Any:
            value = factory(token)
            if isinstance(value, _Bad):
                seen.append(value)
            return value

        return parse

    value = json.loads(text, parse_float=mark(_float), parse_int=mark(_int), parse_constant=mark(_Bad))
    if seen:
        raise BadNumbers(bad_numbers(value, prefix))
    return value


def bad_numbers(value: Any, path: str = "", *, limit: int = 10) -> list[tuple[str, str]]:
    """Every number in ``value`` that JSON or jsonb cannot carry, by path (at most ``limit``)."""
    found: list[tuple[str, str]] = []
    # Iterative: a request nested thousands deep must be refused by its depth check, not crash here.
    todo: list[tuple[Any, str]] = [(value, path)]
    while todo and len(found) < limit:
        v, at = todo.pop()
        if isinstance(v, _Bad):
            found.append((at or "$", f"{WHY}: {v.text}"))
        elif isinstance(v, float) and not math.isfinite(v):
            found.append((at or "$", f"{WHY}: {v!r}"))
        elif isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > MAX_INT_DIGITS * 3.33:
            found.append((at or "$", f"{WHY}: an integer of about {int(v.bit_length() / 3.33)} digits"))
        elif isinstance(v, Mapping):
            todo.extend((item, f"{at}.{k}" if at else str(k)) for k, item in reversed(list(v.items())))
        elif isinstance(v, (list, tuple)):
            todo.extend((item, f"{at}[{i}]") for i, item in reversed(list(enumerate(v))))
    return found
