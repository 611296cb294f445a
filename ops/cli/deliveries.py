"""evq deliveries list: what providers' webhooks said became of each message (worker/delivery.py)."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table, table_group

deliveries = table_group("deliveries")


@from_table("deliveries.list", deliveries)
@command
def deliveries_list(
    out: Output,
    unmatched: bool,
    step: int | None,
    provider: str | None,
    since: int | None,
    limit: int,
    offset: int,
    database_url: str | None,
) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.list_deliveries(
                store,
                Caller(None, trusted_reader=True),
                unmatched=unmatched,
                step=step,
                provider=provider,
                since=since,
                limit=limit,
                offset=offset,
            )

    out.reply(run(fetch()), human=_human)


def _human(data: list[dict[str, Any]]) -> str:
    if not data:
        return "no delivery events"
    rows = [
        {
            **d,
            "when": d["occurred_at"] or d["received_at"],
            "matched": f"{d['step']} ({d['run_id']}/{d['step_id']})" if d["step"] is not None else "none",
            "to": d["recipient"] or "-",
        }
        for d in data
    ]
    return table(
        rows,
        [
            ("id", "id"),
            ("when", "when"),
            ("provider", "provider"),
            ("type", "type"),
            ("to", "recipient"),
            ("matched", "step"),
        ],
    )
