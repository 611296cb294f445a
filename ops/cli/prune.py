"""evq steps prune (formerly `evq prune`): retention, the only command that removes evidence.

A write command for administrators: it deletes history for good, so it needs an
admin key (Permission.PRUNE), except to count with --dry-run. Long work by the
contract's rules (ops/app/longwork.py): the first Ctrl-C or SIGTERM lets the batch in
progress commit, then answers E_ABORTED (exit 7) with what was deleted.
"""

from __future__ import annotations

import click

from evq.ops import wiring
from evq.ops.app.longwork import interruptible
from evq.ops.cli.auth import Credential
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output
from evq.ops.cli.steps import steps
from evq.ops.cli.table import from_table
from evq.worker.errors import Aborted
from evq.worker.pruner import Pruner, PrunerConfig, parse_retention
from evq.worker.records import PruneCounts


@from_table("steps.prune", steps)
@command
def prune_cmd(
    out: Output, older_than: str, batch_size: int, dry_run: bool, credential: Credential, database_url: str | None
) -> None:
    settings = load_settings(database_url=database_url)
    config = PrunerConfig(older_than=parse_retention(older_than), batch=batch_size, dry_run=dry_run)

    def progress(total: PruneCounts) -> None:
        click.echo(
            f"prune: {total.batches} batches, {total.steps} steps, {total.evidence} evidence rows, "
            f"{total.decisions} decisions, {total.refusals} refused enqueues, {total.budgets} budget counters deleted "
            f"({total.partitions} evidence partitions dropped whole)",
            err=True,
        )

    async def go() -> tuple[PruneCounts, str, bool]:
        async with interruptible("prune", unit="batch") as stop, wiring.open_store(settings) as store:
            actor = "dry-run" if dry_run else (await credential.identify(store)).name
            pruner = Pruner(store, config, actor=actor, progress=progress, should_stop=stop.is_set)
            counts = await pruner.run_once()
            assert pruner.last_cutoff is not None
            return counts, pruner.last_cutoff.isoformat(), pruner.stopped

    counts, cutoff, stopped = run(go())
    data = {
        "dry_run": dry_run,
        "cutoff": cutoff,
        "steps": counts.steps,
        "evidence": counts.evidence,
        "decisions": counts.decisions,
        "batches": counts.batches,
        "refusals": counts.refusals,
        "partitions": counts.partitions,
        "budgets": counts.budgets,
    }
    if stopped:
        # Every batch counted here is committed and in prune_log (the refused enqueues and
        # budget counters deleted too, though not logged there); the rest is untouched.
        raise Aborted(
            f"prune: stopped by an interrupt after {counts.batches} batches ({counts.steps} steps, "
            f"{counts.evidence} evidence rows, {counts.decisions} decisions, {counts.refusals} refused enqueues "
            f"and {counts.budgets} budget counters {'counted' if dry_run else 'deleted'})",
            hint="a dry run deletes nothing: run it again to count everything"
            if dry_run
            else "run the same command again for the rest (the same --older-than finds what is left)",
            context=data,
        )
    verb = "would delete" if dry_run else "deleted"
    out.success(
        data,
        human=lambda d: (
            f"{verb} {d['steps']} steps, {d['evidence']} evidence rows and {d['decisions']} decisions "
            f"created and closed before {d['cutoff']}, {d['refusals']} refused enqueues recorded before it "
            f"and {d['budgets']} budget counters whose window closed before it"
            + (
                ""
                if dry_run
                else f" ({d['batches']} batches, {d['partitions']} of them whole evidence partitions; see prune_log)"
            )
        ),
    )
