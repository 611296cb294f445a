"""evq runs show"""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.steps import EVIDENCE_COLUMNS, evidence_line
from evq.ops.cli.table import from_table, table_group

runs = table_group("runs")


@from_table("runs.show", runs)
@command
def runs_show(out: Output, run_id: str, limit: int, offset: int, database_url: str | None) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.show_run(
                store,
                Caller(None, trusted_reader=True),
                run_id,
                limit=limit,
                offset=offset,
                unresolvable=settings.policy().unresolvable,
            )

    reply = run(fetch())
    out.reply(reply, human=lambda d: _human(d, reply.meta))


def _pages(d: dict[str, Any], meta: dict[str, Any]) -> str:
    """Which steps of the run this page shows, and how to read the next."""
    total = f"{meta['total']:,}" + ("" if meta["total_exact"] else "+")
    shown, first = len(d["steps"]), meta["offset"] + 1
    line = f"run {d['run_id']}: " + (
        f"steps {first:,}-{first + shown - 1:,} of {total}" if shown else f"no step past {meta['offset']:,} of {total}"
    )
    if shown == meta["limit"] and (meta["offset"] + shown < meta["total"] or not meta["total_exact"]):
        line += f" (next: --offset {meta['offset'] + meta['limit']})"
    return line


def _human(d: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        _pages(d, meta),
        table(
            [{**s, "delivered": (s.get("delivery") or {}).get("state", "-")} for s in d["steps"]],
            [
                ("id", "id"),
                ("step_id", "step"),
                ("status", "status"),
                ("reason", "reason"),
                ("attempts", "tries"),
                ("delivered", "delivery"),
                ("message_id", "message-id"),
            ],
        ),
        "",
        "chain",
        table(
            [{**evidence_line(e), "step": e["step"], "note": _note(e)} for e in d["events"]],
            [("at", "at"), ("step", "step"), *EVIDENCE_COLUMNS[1:]],
        ),
    ]
    return "\n".join(lines)


def _note(e: dict[str, Any]) -> Any:
    detail = e["detail"]
    if e["kind"] == "decision":
        return " / ".join(str(detail[k]) for k in ("intent", "model", "tool", "instruction_version") if detail.get(k))
    if e["kind"] == "enqueued":
        return f"{', '.join(detail['to'])}: {detail['subject']}"
    return evidence_line(e)["note"]
