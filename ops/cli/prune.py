"""evq prune: retention, the only command that removes evidence.

A write command for administrators: it deletes history for good, so it needs an
admin key (Permission.PRUNE), except to count with --dry-run.
"""

from __future__ import annotations

import click

from evq.ops import wiring
from evq.ops.cli.auth import Credential, api_key_option, dry_run_option
from evq.ops.cli.common import command, database_option, load_settings, output_option, run
from evq.ops.cli.output import Output
from evq.worker.keys import Permission
from evq.worker.pruner import RETENTION_HELP, Pruner, PrunerConfig, parse_retention
from evq.worker.records import PruneCounts


@click.command("prune")
@click.option(
    "--older-than",
    required=True,
    metavar="90d",
    help="Delete terminal steps created and closed longer ago than this, by the database's clock. "
    f"Units: {RETENTION_HELP}. `m` is refused as ambiguous (write min or mo).",
)
@click.option("--batch-size", type=int, default=1000, show_default=True, help="Steps deleted per transaction.")
@dry_run_option
@api_key_option(Permission.PRUNE)
@output_option
@database_option
@command
def prune_cmd(
    out: Output, older_than: str, batch_size: int, dry_run: bool, credential: Credential, database_url: str | None
) -> None:
    """Delete accepted and rejected steps older than --older-than, with their
    evidence and decisions, in batches; each batch is one transaction and one row
    of prune_log. Steps in flight, retryable or unknown are never deleted, nor a
    step whose failure notice is not yet old and terminal (it goes with its notice).
    "Older" is measured on the database's clock, never this machine's.
    Needs an API key with role admin (not for --dry-run, which only counts).

    Progress goes to stderr. Ctrl-C is safe: finished batches stay done and
    logged, the batch in progress is rolled back.

    \b
    evq prune --older-than 90d --dry-run
    evq prune --older-than 90d -o json
    """
    settings = load_settings(database_url=database_url)
    config = PrunerConfig(older_than=parse_retention(older_than), batch=batch_size, dry_run=dry_run)

    def progress(total: PruneCounts) -> None:
        click.echo(
            f"prune: {total.batches} batches, {total.steps} steps, {total.evidence} evidence rows, "
            f"{total.decisions} decisions deleted",
            err=True,
        )

    async def go() -> tuple[PruneCounts, str]:
        async with wiring.open_store(settings) as store:
            actor = "dry-run" if dry_run else (await credential.identify(store)).name
            pruner = Pruner(store, config, actor=actor, progress=progress)
            counts = await pruner.run_once()
            assert pruner.last_cutoff is not None
            return counts, pruner.last_cutoff.isoformat()

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
        human=lambda d: (
            f"{verb} {d['steps']} steps, {d['evidence']} evidence rows and {d['decisions']} decisions "
            f"created and closed before {d['cutoff']}"
            + ("" if dry_run else f" ({d['batches']} batches, see prune_log)")
        ),
    )
