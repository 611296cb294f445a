"""The JSON contract every interface prints or answers with (CLI ``-o json``, HTTP, MCP):

    {"status": "success" | "error" | "partial_failure", "schema_version": 4,
     "data" | "error": ..., "meta": {"duration_ms": ..., ...}}

Times are ISO 8601 with a zone, numbers are numbers: integers (durations in whole milliseconds,
``duration_ms``), unless their unit needs fractions (a benchmark's measured figures). A display
value that is not a machine key comes as a ``_label`` beside its key (ops/app/labels.py). The
schemas are ops/app/cli-schema/; their README says when ``schema_version`` changes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from typing import Any

from evq.worker.errors import EvqError

SCHEMA_VERSION = 4  # 4: `evq schema` by product (the schema contract's names); 3: evidence kind delivery_event; 2: `evq schema` output by tool (canonical_path, parameters by flag); see CHANGELOG

# Fixed from now on; documented in ops/app/cli-schema/error-codes.md.
EXIT_CODES: dict[str, int] = {
    "E_NOT_FOUND": 1,
    "E_INTERNAL": 1,
    "E_INVALID_ARG": 2,
    "E_UNRESOLVABLE": 2,
    "E_BUDGET": 2,
    "E_CONFLICT": 3,
    "E_AUTH_FAILED": 4,
    "E_SCHEMA_MISMATCH": 5,
    "E_PARTIAL_FAILURE": 6,
    "E_ABORTED": 7,
    "E_MAX_FAILURES": 8,
    "E_DB_UNAVAILABLE": 9,
}
EXIT_INTERRUPTED = 130


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    raise TypeError(f"not JSON-serializable: {type(value).__name__}")


def to_json(value: Any) -> str:
    return json.dumps(value, default=_default, ensure_ascii=False)


def plain(value: Any) -> Any:
    """``value`` as JSON types only (datetimes as ISO strings, ...)."""
    return json.loads(to_json(value))


class Timer:
    """Started when a request or command begins; ``meta()`` is the contract's meta with its duration."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        # Named parts of the time (ms), in the order they ended: a page's reads and its drawing,
        # which /ops answers name in their Server-Timing beside the whole (ops/web/protocol.py).
        self.parts: dict[str, float] = {}

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as the part ``name`` (a second block of the same name adds to it)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + (time.perf_counter() - started) * 1000

    def meta(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        # Whole milliseconds: a duration is an integer (the contract's numbers are integers unless
        # their unit needs fractions); a command that took less than half of one says 0.
        return {"duration_ms": round((time.perf_counter() - self.started) * 1000), **(extra or {})}


def success(data: Any, meta: dict[str, Any], status: str = "success") -> dict[str, Any]:
    return {"status": status, "schema_version": SCHEMA_VERSION, "data": data, "meta": meta}


def failure(exc: EvqError, meta: dict[str, Any]) -> dict[str, Any]:
    return {"status": "error", "schema_version": SCHEMA_VERSION, "error": exc.to_dict(), "meta": meta}
