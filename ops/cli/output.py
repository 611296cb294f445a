"""The command-line contract: one JSON object on stdout with ``-o json``, a table
for people otherwise, and fixed exit codes for every error code.

    {"status": "success" | "error" | "partial_failure", "schema_version": 3,
     "data" | "error": ..., "meta": {"duration_ms": ..., ...}}

Logs never go to stdout. Times are ISO 8601 with a zone, numbers are numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import click

from evq.ops.app.age import age
from evq.ops.app.contract import EXIT_CODES, EXIT_INTERRUPTED, SCHEMA_VERSION, Timer, failure, success, to_json
from evq.worker.errors import EvqError

__all__ = ["EXIT_CODES", "EXIT_INTERRUPTED", "SCHEMA_VERSION", "Output", "age", "json_requested", "table", "to_json"]


class Output:
    """What one command prints, in the format asked for."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.timer = Timer()

    @property
    def json(self) -> bool:
        return self.fmt == "json"

    def meta(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        from evq.ops import wiring

        meta = self.timer.meta(extra)
        used = wiring.database_used()
        if used is not None:
            # Which database the command used (never its password): no one wonders which one it was.
            meta["database"] = used
        return meta

    def success(
        self,
        data: Any,
        *,
        human: Callable[[Any], str] | None = None,
        meta: Mapping[str, Any] | None = None,
        status: str = "success",
    ) -> None:
        if self.json:
            click.echo(to_json(success(data, self.meta(meta), status)))
        else:
            click.echo(human(data) if human else to_json(data))

    def reply(self, reply: Any, *, human: Callable[[Any], str] | None = None) -> None:
        """A service.Reply: its data, meta and status."""
        self.success(reply.data, human=human, meta=reply.meta, status=reply.status)

    def error(self, exc: EvqError) -> int:
        if self.json:
            click.echo(to_json(failure(exc, self.meta())))
        else:
            click.echo(f"error: {exc.message}", err=True)
            fields = exc.context.get("fields") if exc.context else None
            for item in fields or ():
                line = f"{item['field']}: {item['message']}"
                # The error's message already names its first field (worker/errors.py's
                # InvalidRequest) or is the one field's message (a setting): said once.
                if line not in exc.message and item["message"] != exc.message:
                    click.echo(f"  {line}", err=True)
            if exc.hint:
                click.echo(f"hint: {exc.hint}", err=True)
        return EXIT_CODES.get(exc.code, 1)


def json_requested(argv: Sequence[str]) -> bool:
    """Whether -o json was asked for, even when the rest of the line does not parse."""
    for i, arg in enumerate(argv):
        if arg in ("-o", "--output") and i + 1 < len(argv) and argv[i + 1] == "json":
            return True
        if arg in ("-ojson", "--output=json"):
            return True
    return False


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str]], *, empty: str = "(none)") -> str:
    """A plain aligned table; ``columns`` are (key, heading)."""
    if not rows:
        return empty
    cells = [[_cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (_, h) in enumerate(columns)]
    lines = ["  ".join(h.upper().ljust(w) for (_, h), w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S%z")
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    text = str(value).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."
