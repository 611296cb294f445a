"""evq runs show"""

from __future__ import annotations

from typing import Any

import click

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, database_option, load_settings, output_option, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.steps import EVIDENCE_COLUMNS, evidence_line


@click.group("runs")
def runs() -> None:
    """Read back an agent run: every step it decided, and everything that happened to each."""


@runs.command("show")
@click.argument("run_id")
@output_option
@database_option
@command
def runs_show(out: Output, run_id: str, database_url: str | None) -> None:
    """Show one run's whole chain in time order: each decision (intent, instruction
    and prompt version, model, tool), its action, every attempt with the adapter's
    answer, and every operator close."""
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.show_run(store, Caller(None, trusted_reader=True), run_id)

    out.reply(run(fetch()), human=_human)


def _human(d: dict[str, Any]) -> str:
    lines = [
        f"run {d['run_id']}: {len(d['steps'])} step{'s' * (len(d['steps']) != 1)}",
        table(
            d["steps"],
            [
                ("id", "id"),
                ("step_id", "step"),
                ("status", "status"),
                ("reason", "reason"),
                ("attempts", "tries"),
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
