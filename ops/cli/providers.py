"""evq providers list: each provider's circuit (worker/circuit.py), and why it is not sending."""

from __future__ import annotations

from typing import Any

import click

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, database_option, load_settings, output_option, run
from evq.ops.cli.output import Output, table
from evq.ops.settings import ADAPTERS


@click.group("providers")
def providers() -> None:
    """The email providers evq sends through, and their circuits."""


@providers.command("list")
@output_option
@database_option
@command
def providers_list(out: Output, database_url: str | None) -> None:
    """List every provider's circuit: closed (sending), open (down or misconfigured:
    nothing is sent, attempts are not charged, a probe goes out after the wait shown)
    or half_open (one probe is out). An open circuit shows why it opened."""
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.list_providers(store, Caller(None, trusted_reader=True), ADAPTERS)

    out.reply(run(fetch()), human=_human)


def _human(data: list[dict[str, Any]]) -> str:
    rows = [
        {
            **d,
            "why": d["reason"] and f"{d['reason']}: {d['detail'] or ''}"[:100],
            "probe": None if d["next_probe_in_seconds"] is None else f"in {d['next_probe_in_seconds']:.0f}s",
        }
        for d in data
    ]
    return table(
        rows,
        [
            ("provider", "provider"),
            ("state", "circuit"),
            ("opened_at", "since"),
            ("failed_probes", "failed probes"),
            ("probe", "next probe"),
            ("why", "why"),
        ],
    )
