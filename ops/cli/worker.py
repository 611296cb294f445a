"""evq worker run: every setting is a flag here (ops/app/commands.py) and an EVQ_* variable everywhere."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table, table_group

worker_group = table_group("worker")


@from_table("worker.run", worker_group)
@command
def worker_run(out: Output, drain: bool, **settings_flags: Any) -> int:
    settings = load_settings(**settings_flags)
    code = run(wiring.run_worker(settings, drain=drain))
    if out.json:
        out.success({"exit_code": code, "drain": drain})
    return code
