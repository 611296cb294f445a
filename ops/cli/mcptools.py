"""evq admin mcp (formerly `evq mcp`): the MCP server for agents, on stdio."""

from __future__ import annotations

import os

from evq.ops import wiring
from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table
from evq.worker.logs import register_secrets


@from_table("admin.mcp", admin)
@command
def mcp(out: Output, database_url: str | None) -> int:
    key = os.environ.get("EVQ_API_KEY") or None
    register_secrets([key])
    settings = load_settings(database_url=database_url)
    wiring.require_mcp()  # a missing extra is said before the database is opened
    url = wiring.database_url(settings)
    wiring.check_database(url)

    run(wiring.run_mcp(settings, key, url=url))
    return 0
