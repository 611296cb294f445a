"""evq admin bench (formerly `evq bench`): measure evq against the raw SQL ceiling and its peers (pgqueuer, DBOS
Transact) on this machine. The benchmark is a tool of the repository (bench/, `python -m bench`), not of the
installed package: this command runs it from the checkout this evq was imported from, and says so elsewhere."""

from __future__ import annotations

import click

from evq.ops import wiring
from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table
from evq.worker.errors import ConfigError, InvalidRequest


def checkout_bench() -> None:
    """Put the checkout holding this evq (and its bench/) first on the path, or refuse."""
    import os
    import sys

    import evq

    root = os.path.dirname(os.path.dirname(os.path.abspath(evq.__file__)))
    if not os.path.isfile(os.path.join(root, "bench", "harness.py")):
        raise ConfigError(
            "the benchmark is a tool of evq's repository, not of the installed package",
            hint="run it from a checkout: git clone evq; pip install -e '.[bench]'; python -m bench --quick",
        )
    if root not in sys.path:
        sys.path.insert(0, root)


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
    checkout_bench()
    from bench.harness import Bench, BenchConfig, human

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
