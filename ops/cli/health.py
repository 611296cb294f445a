"""`evq admin health`: the health gate (ops/app/health.py), for people and for agents before they write."""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app.health import check_health, exit_code
from evq.ops.app.service import Caller
from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table


@from_table("admin.health", admin)
@command
def admin_health(out: Output, database_url: str | None) -> int:
    settings = load_settings(database_url=database_url)
    # The command line reads without a key, as every read of it does (whoever runs it reaches the database).
    reader = wiring.health_reader(settings)
    used = wiring.database_used() or {}
    where = f"{used.get('host')}:{used.get('port')}/{used.get('database')}" if used else None
    reply = run(check_health(reader, Caller(None, trusted_reader=True), database=where))
    out.reply(reply, human=_human)
    return exit_code(reply.data)


def _human(data: dict[str, Any]) -> str:
    rows = [{**c, "ok": "ok" if c["ok"] else "FAIL"} for c in data["checks"]]
    verdict = "healthy" if data["healthy"] else "NOT healthy"
    return table(rows, [("name", "check"), ("ok", "ok"), ("detail", "detail")]) + f"\n{verdict}"
