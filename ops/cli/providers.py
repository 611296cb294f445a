"""evq providers list: each provider's profile (what settles a lost answer), rate limit and circuit
(worker/circuit.py), and why it is not sending."""

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


def settles_by(profile: dict[str, Any] | None) -> str:
    """A profile in words: what can settle a send whose answer was lost."""
    if profile is None:
        return "? (no adapter)"
    ways = []
    if profile["dedupe_window_seconds"]:
        ways.append(f"dedupe {profile['dedupe_window_seconds']}s")
    if profile["lookup_by"]:
        ways.append("lookup by " + "+".join(profile["lookup_by"]))
    if profile["webhook_events"]:
        ways.append(f"webhook ({len(profile['webhook_events'])} events)")
    return ", ".join(ways) if ways else "NOTHING: unresolvable"


def _human(data: list[dict[str, Any]]) -> str:
    rows = [
        {
            **d,
            "provider": d["provider"] + ("" if d["configured"] else " (not in EVQ_ADAPTER)"),
            "settles": settles_by(d["profile"]),
            "rate": d["rate_limit"]["setting"].partition("=")[2] if d["rate_limit"] else "-",
            "why": d["reason"] and f"{d['reason']}: {d['detail'] or ''}"[:100],
            "probe": None if d["next_probe_in_seconds"] is None else f"in {d['next_probe_in_seconds']:.0f}s",
        }
        for d in data
    ]
    return table(
        rows,
        [
            ("provider", "provider"),
            ("settles", "a lost answer settled by"),
            ("rate", "rate limit"),
            ("state", "circuit"),
            ("opened_at", "since"),
            ("failed_probes", "failed probes"),
            ("probe", "next probe"),
            ("why", "why"),
        ],
    )
