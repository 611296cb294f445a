"""evq admin bench (formerly `evq bench`): measure evq against the raw SQL ceiling and its peers (pgqueuer, DBOS Transact) on this machine."""

from __future__ import annotations

import click

from evq.ops import wiring
from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table
from evq.worker.errors import InvalidRequest


@from_table("admin.bench", admin)
@command
def bench_cmd(
    out: Output,
    quick: bool,
    steps: int | None,
    runs: int | None,
    repeat: int | None,
    modes: tuple[str, ...],
    scale_rows: int | None,
    processes: str | None,
    peer: str,
    database_url: str | None,
) -> None:
    from evq.ops.bench.harness import Bench, BenchConfig, human

    settings = load_settings(database_url=database_url)
    url = wiring.database_url(settings)
    overrides = {k: v for k, v in {"steps": steps, "runs": runs, "scale_rows": scale_rows}.items() if v is not None}
    if repeat is not None:
        overrides["page_repeat"] = repeat
    if modes:
        overrides["modes"] = tuple(modes)
        if "ops-pages" in modes and steps is not None:
            overrides["page_steps"] = steps  # --steps sizes the pages' database too
        if "retention" in modes and scale_rows is not None:
            overrides["retention_rows"] = scale_rows  # --scale-rows sizes the retention fill too
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
