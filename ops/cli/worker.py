"""evq worker run: every setting is a flag here (ops/app/commands.py) and an EVQ_* variable everywhere."""

from __future__ import annotations

from typing import Any

import click

from evq.ops import wiring
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import EXIT_CODES, Output
from evq.ops.cli.table import from_table, table_group

worker_group = table_group("worker")


@from_table("worker.run", worker_group)
@command
def worker_run(out: Output, drain: bool, **settings_flags: Any) -> int:
    settings = load_settings(**settings_flags)
    summary: dict[str, Any] = {}
    code = run(wiring.run_worker(settings, drain=drain, summary=summary))
    # A drain whose every attempt failed delivered nothing: E_PARTIAL_FAILURE (exit 6), as
    # `admin health` says of an open circuit: the run finished, the sends did not.
    failed = bool(drain and code == 0 and summary.get("all_failed"))
    if failed:
        code = EXIT_CODES["E_PARTIAL_FAILURE"]
    if out.json:
        out.success({"exit_code": code, "drain": drain, **summary}, status="partial_failure" if failed else "success")
    elif drain and summary:
        click.echo(_human(summary))
    return code


def _human(summary: dict[str, Any]) -> str:
    outcomes = ", ".join(f"{n} {kind}" for kind, n in sorted(summary["outcomes"].items())) or "nothing to send"
    lines = [f"drained: {summary['claimed']} claimed, {outcomes}"]
    for streak in summary["failing"]:
        line = f"failing: {streak['provider']}: {_attempts(streak['attempts'])} in a row failed: {streak['detail']}"
        lines.append(line + (f"\n  fix: {streak['hint']}" if streak["hint"] else ""))
    if summary["all_failed"]:
        lines.append("every attempt failed: nothing was delivered (exit 6)")
    return "\n".join(lines)


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"
