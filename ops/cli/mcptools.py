"""evq mcp: the MCP server for agents, on stdio."""

from __future__ import annotations

import os

import click

from evq.ops import wiring
from evq.ops.cli.common import command, database_option, load_settings, output_option, run
from evq.ops.cli.output import Output
from evq.worker.logs import register_secrets


@click.command("mcp")
@output_option
@database_option
@command
def mcp(out: Output, database_url: str | None) -> int:
    """Serve evq's commands as MCP tools over stdio (for an agent's MCP client):
    evq_email_send, evq_steps_get, evq_steps_list, evq_runs_get, and
    evq_steps_resolve with EVQ_MCP_RESOLVE=true (it dry-runs unless told not to).

    The API key comes from EVQ_API_KEY in the server's environment, never from a
    tool's arguments; every call is checked with it (reads: any role). stdout is
    the protocol's: logs go to stderr, and -o json prints only an error at startup.

    \b
    EVQ_API_KEY=evq_... evq mcp
    """
    key = os.environ.get("EVQ_API_KEY") or None
    register_secrets([key])
    settings = load_settings(database_url=database_url)
    url = wiring.database_url(settings)
    wiring.check_at_head(url)

    async def serve() -> None:
        from evq.ops.mcp.server import build_server
        from evq.ops.mcp.stdio import run_stdio

        async with wiring.open_store(settings, url=url, max_size=4, patient=True) as store:
            await run_stdio(build_server(store, settings, key), max_line=settings.max_input_bytes)

    run(serve())
    return 0
