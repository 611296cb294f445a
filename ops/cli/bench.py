"""evq bench: measure evq against the raw SQL ceiling and pgqueuer on this machine."""

from __future__ import annotations

import click

from evq.ops import wiring
from evq.ops.bench.modes import MODES
from evq.ops.cli.common import command, database_option, load_settings, output_option
from evq.ops.cli.output import Output
from evq.worker.errors import InvalidRequest


@click.command("bench")
@click.option("--quick", is_flag=True, help="CI-sized: every mode in well under a minute, one run each.")
@click.option("--steps", type=int, default=None, help="Steps per drain (default 20,000; --quick 2,000).")
@click.option(
    "--runs", type=click.IntRange(min=1), default=None, help="Repeats of every figure (default 3; --quick 1)."
)
@click.option(
    "--mode",
    "modes",
    multiple=True,
    type=click.Choice(MODES),
    help="Run only this mode; repeatable (default: all).",
)
@click.option("--scale-rows", type=int, default=None, help="Terminal rows for the scale mode (default 1,000,000).")
@click.option(
    "--processes",
    default=None,
    metavar="1,2",
    help="Worker processes for the drain mode, comma-separated (default 1,2).",
)
@click.option(
    "--peer",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="Measure pgqueuer (the 'bench' extra): auto = when installed.",
)
@output_option
@database_option
@command
def bench_cmd(
    out: Output,
    quick: bool,
    steps: int | None,
    runs: int | None,
    modes: tuple[str, ...],
    scale_rows: int | None,
    processes: str | None,
    peer: str,
    database_url: str | None,
) -> None:
    """Run the benchmark and print every figure (median, min-max over runs) with its
    ratios to the raw SQL ceiling and to pgqueuer, measured in the same run.

    It creates scratch databases on the server of --database-url (it needs CREATE
    DATABASE) and drops them afterwards; it never touches the evq database itself.
    Progress goes to stderr.

    \b
    evq bench                  # every mode, 3 runs each: a few minutes
    evq bench --quick -o json  # CI-sized
    """
    from evq.ops.bench.harness import Bench, BenchConfig, human

    settings = load_settings(database_url=database_url)
    url = wiring.database_url(settings)
    overrides = {k: v for k, v in {"steps": steps, "runs": runs, "scale_rows": scale_rows}.items() if v is not None}
    if modes:
        overrides["modes"] = tuple(modes)
    if processes:
        try:
            overrides["drain_processes"] = tuple(int(p) for p in processes.split(","))
        except ValueError:
            raise InvalidRequest(
                [{"field": "--processes", "message": f"expected e.g. 1,2,4, got {processes!r}"}]
            ) from None
    config = BenchConfig.quick(url, peer=peer, **overrides) if quick else BenchConfig(url, peer=peer, **overrides)
    report = Bench(config, progress=lambda what: click.echo(f"bench: {what}", err=True)).run()
    out.success(report, human=human)
