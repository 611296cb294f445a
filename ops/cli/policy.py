"""evq policy show: the approval policy (worker/approval_policy.py) and the budgets' use this window."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table, table_group

policy = table_group("policy")


@from_table("policy.show", policy)
@command
def policy_show(out: Output, database_url: str | None) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.show_policy(store, Caller(None, trusted_reader=True), settings)

    out.reply(run(fetch()), human=_human)


def _human(data: dict[str, Any]) -> str:
    hours = data["hours"]
    expires = data["expires_after_seconds"]
    lines = [
        f"hold every send:    {'yes' if data['always'] else 'no'}",
        f"first contact:      {data['first_contact']}",
        f"most recipients:    {data['max_recipients'] if data['max_recipients'] is not None else '-'}",
        "allowed hours:      "
        + (
            "any"
            if hours is None
            else f"{hours['start']}-{hours['end']} {hours['timezone']}, weekdays {hours['weekdays']}"
        ),
        f"held sends expire:  {'never' if expires is None else f'after {expires / 3600:g}h'}",
        "budgets:            "
        + (", ".join(f"{b['budget']} {b['cap']}" for b in data["budgets"]) or "none")
        + f" (over one: {data['over_budget']})",
    ]
    if data["keys"]:
        lines += ["", "keys that enqueue, and whether their sends wait for a person:"]
        lines += [f"  {k['name']} ({k['role']}): {k['approval']}" for k in data["keys"]]
    if data["usage"]:
        lines += [
            "",
            table(data["usage"], [("budget", "budget"), ("scope", "scope"), ("used", "used"), ("cap", "cap")]),
        ]
    return "\n".join(lines)
