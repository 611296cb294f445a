"""evq admin db-upgrade | db-version (formerly `evq db upgrade | status`)"""

from __future__ import annotations

from evq.ops import wiring
from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings
from evq.ops.cli.output import Output
from evq.ops.cli.table import from_table
from evq.worker.errors import SchemaMismatch


@from_table("admin.db-upgrade", admin)
@command
def db_upgrade(out: Output, runtime_role: str | None, dry_run: bool, database_url: str | None) -> None:
    url = wiring.database_url(load_settings(database_url=database_url))
    if dry_run:
        pending = wiring.pending_revisions(url)
        current, head = wiring.revisions(url)
        out.success(
            {"dry_run": True, "revision": current, "target": head, "pending": pending},
            human=lambda d: (
                f"dry run: would apply {', '.join(d['pending'])}" if d["pending"] else "dry run: already current"
            ),
        )
        return
    before, after, granted = wiring.migrate(url, runtime_role=runtime_role)
    data = {
        "dry_run": False,
        "revision_before": before,
        "revision": after,
        "changed": before != after,
        "runtime_roles": granted,
    }
    out.success(
        data,
        human=lambda d: (
            f"database at revision {d['revision']}"
            + (f" (migrated from {d['revision_before'] or 'empty'})" if d["changed"] else " (already current)")
            + (f"; runtime privileges granted to {', '.join(d['runtime_roles'])}" if d["runtime_roles"] else "")
        ),
    )


@from_table("admin.db-version", admin)
@command
def db_status(out: Output, database_url: str | None) -> None:
    url = wiring.database_url(load_settings(database_url=database_url))
    current, head = wiring.revisions(url)
    if current != head:
        raise SchemaMismatch(
            f"database revision {current or '(none)'}, this evq needs {head}",
            hint=wiring.upgrade_hint(),
            context={"current": current, "expected": head, "pending": wiring.pending_revisions(url)},
        )
    out.success(
        {"revision": current, "expected": head, "at_head": True},
        human=lambda d: f"database revision {d['revision']}: current",
    )
