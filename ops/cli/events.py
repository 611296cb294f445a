"""evq events list: a key's event feed (every rejection, unknown and verdict on its sends)."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.cli.auth import Credential
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table, table_group

events = table_group("events")


@from_table("events.list", events)
@command
def events_list(
    out: Output,
    since: int,
    limit: int,
    offset: int,
    key: str | None,
    all_keys: bool,
    credential: Credential,
    database_url: str | None,
) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.list_events(
                store, credential.caller, since=since, limit=limit, offset=offset, key=key, all_keys=all_keys
            )

    reply = run(fetch())
    out.reply(reply, human=lambda d: _human(d, reply.meta))


def _human(d: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    rows = table(
        d,
        [
            ("id", "cursor"),
            ("created_at", "at"),
            ("kind", "kind"),
            ("step", "step"),
            ("run_id", "run"),
            ("step_id", "step_id"),
            ("reason", "reason"),
            ("actor", "by"),
            ("detail", "detail"),
        ],
    )
    return f"{rows}\nnext: evq events list --since {meta['next_cursor']}"
