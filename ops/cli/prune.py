"""evq prune: retention, the only command that removes evidence.

A write command for administrators (it deletes history for good): keep it
behind whatever guards write commands (API keys) and run it deliberately.
"""

from __future__ import annotations

import getpass
import socket

import click

from ops import wiring
from ops.cli.common import command, database_option, load_settings, output_option, run
from ops.cli.output import Output
from ops.cli.steps import parse_duration
from worker.pruner import PruneCounts, Pruner, PrunerConfig


@click.command("prune")
@click.option("--older-than", required=True, metavar="90d", help="Delete terminal steps created and closed longer ago than this (s, m, h, d).")
@click.option("--dry-run", is_flag=True, help="Only count what would be deleted.")
@click.option("--batch-size", type=int, default=1000, show_default=True, help="Steps deleted per transaction.")
@output_option
@database_option
@command
def prune_cmd(out: Output, older_than: str, dry_run: bool, batch_size: int, database_url: str | None) -> None:
    """Delete accepted and rejected steps older than --older-than, with their
    evidence and decisions, in batches; each batch is one transaction and one row
    of prune_log. Steps in flight, retryable or unknown are never deleted.

    Progress goes to stderr. Ctrl-C is safe: finished batches stay done and
    logged, the batch in progress is rolled back.

    \b
    evq prune --older-than 90d --dry-run
    evq prune --older-than 90d -o json
    """
    settings = load_settings(database_url=database_url)
    config = PrunerConfig(older_than=parse_duration(older_than), batch=batch_size, dry_run=dry_run)
    actor = f"prune:{getpass.getuser()}@{socket.gethostname()}"

    def progress(total: PruneCounts) -> None:
        click.echo(
            f"prune: {total.batches} batches, {total.steps} steps, {total.evidence} evidence rows, "
            f"{total.decisions} decisions deleted",
            err=True,
        )

    async def go() -> tuple[PruneCounts, str]:
        async with wiring.open_store(settings) as store:
            pruner = Pruner(store, config, actor=actor, progress=progress)
            return await pruner.run_once(), pruner.cutoff().isoformat()

    counts, cutoff = run(go())
    data = {
        "dry_run": dry_run,
        "cutoff": cutoff,
        "steps": counts.steps,
        "evidence": counts.evidence,
        "decisions": counts.decisions,
        "batches": counts.batches,
    }
    verb = "would delete" if dry_run else "deleted"
    out.success(
        data,
        human=lambda d: f"{verb} {d['steps']} steps, {d['evidence']} evidence rows and {d['decisions']} decisions "
        f"created and closed before {d['cutoff']}" + ("" if dry_run else f" ({d['batches']} batches, see prune_log)"),
    )
