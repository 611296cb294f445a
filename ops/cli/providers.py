"""evq providers list: each provider's circuit (worker/circuit.py), and why it is not sending."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table, table_group

providers = table_group("providers")


@from_table("providers.list", providers)
@command
def providers_list(out: Output, database_url: str | None) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.list_providers(store, Caller(None, trusted_reader=True), settings)

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
