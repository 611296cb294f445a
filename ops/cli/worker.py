"""evq worker run: every setting is a flag here (ops/app/commands/) and an EVQ_* variable everywhere."""

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
    # `admin health` says of an open circuit: the run finished, the sends did not. So does a
    # drain that left due steps unsent behind an open circuit (after the cause was fixed, the
    # circuit holds them until its probe is due): the same code, from the CLI's fixed table
    # (ops/app/contract.py), not sysexits' EX_TEMPFAIL (75), which no evq command uses; a
    # script tells "finished, not everything sent" from a bad flag (2) or no database (9).
    failed = bool(drain and code == 0 and (summary.get("all_failed") or summary.get("circuit_held")))
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
    for w in summary.get("waiting", ()):
        lines.extend(_waiting(w))
    if summary["all_failed"]:
        lines.append("every attempt failed: nothing was delivered (exit 6)")
    elif summary.get("circuit_held"):
        lines.append(f"{_steps(summary['circuit_held'])} due left unsent behind an open circuit (exit 6)")
    return "\n".join(lines)


def _waiting(w: dict[str, Any]) -> list[str]:
    """What the drain left for one provider, and what to do about it."""
    provider, circuit, lines = w["provider"], w["circuit"], []
    if circuit is not None and (w["due"] or w["later"]):
        why = circuit["reason"] + (f": {circuit['detail']}" if circuit["detail"] else "")
        state = "half-open (a probe is out)" if circuit["state"] == "half_open" else "open"
        held = f"{_steps(w['due'])} {'waits' if w['due'] == 1 else 'wait'}" if w["due"] else "the steps below wait"
        lines.append(
            f"waiting: {provider}: {held}: circuit for {provider} {state} since "
            f"{circuit['since']} ({why}), next probe at {circuit['next_probe_at']}"
        )
        lines.append(
            f"  do: fix the cause, then wait for the probe: `evq worker run --drain` after {circuit['next_probe_at']} "
            f"(or a running worker) sends one step; once it gets through the circuit closes and the rest go. "
            "No command closes a circuit by hand; `evq providers list` shows it"
        )
    if w["later"]:
        lines.append(
            f"later: {provider}: {_steps(w['later'])} scheduled later (send_at or a retry), the first at {w['next_at']}"
        )
    if w["held"]:
        lines.append(
            f"held: {provider}: {_steps(w['held'])} {'waits' if w['held'] == 1 else 'wait'} for approval: "
            "`evq steps list --status held`, then `evq steps approve ID`"
        )
    return lines


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"
