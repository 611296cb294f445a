"""evq refusals list: the enqueues evq refused, what was asked and why (worker/refusals.py)."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table, table_group

refusals = table_group("refusals")


@from_table("refusals.list", refusals)
@command
def refusals_list(
    out: Output,
    key_name: str | None,
    interface: str | None,
    before_id: int | None,
    limit: int,
    offset: int,
    database_url: str | None,
) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.list_refusals(
                store,
                Caller(None, trusted_reader=True),
                key_name=key_name,
                interface=interface,
                before_id=before_id,
                limit=limit,
                offset=offset,
            )

    out.reply(run(fetch()), human=_human)


def _human(data: list[dict[str, Any]]) -> str:
    if not data:
        return "no refused enqueues recorded"
    rows = [
        {
            **d,
            "key": d["key_name"] or "-",
            "what": ", ".join(f"{a.get('run_id', '?')}/{a.get('step_id', '?')}" for a in d["asked"][:3])[:60],
            "why": "; ".join(f"{e['field']}: {e['message']}" for e in d["errors"][:2])[:100]
            + (f" (+{d['error_count'] - 2})" if d["error_count"] > 2 else ""),
        }
        for d in data
    ]
    return table(
        rows,
        [("id", "id"), ("created_at", "when"), ("interface", "via"), ("key", "key"), ("what", "asked"), ("why", "why")],
    )
