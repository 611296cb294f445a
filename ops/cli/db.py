"""evq db upgrade | status"""

from __future__ import annotations

import click

from adapters.postgres.database import current_revision, head_revision, upgrade
from ops import wiring
from ops.cli.common import command, database_option, load_settings, output_option
from ops.cli.output import Output


@click.group("db")
def db() -> None:
    """Create or migrate evq's tables (Alembic)."""


@db.command("upgrade")
@output_option
@database_option
@command
def db_upgrade(out: Output, database_url: str | None) -> None:
    """Migrate the database to this evq's schema. Safe to run again; run it before
    starting workers of a new evq version."""
    url = wiring.database_url(load_settings(database_url=database_url))
    before, after = upgrade(url)
    data = {"revision_before": before, "revision": after, "changed": before != after}
    out.success(
        data,
        human=lambda d: f"database at revision {d['revision']}"
        + (f" (migrated from {d['revision_before'] or 'empty'})" if d["changed"] else " (already current)"),
    )


@db.command("status")
@output_option
@database_option
@command
def db_status(out: Output, database_url: str | None) -> int:
    """Show the database's schema revision and the one this evq needs (exit 5 if they differ)."""
    url = wiring.database_url(load_settings(database_url=database_url))
    current, head = current_revision(url), head_revision()
    data = {"revision": current, "expected": head, "at_head": current == head}
    out.success(
        data,
        human=lambda d: f"database revision {d['revision'] or '(none)'}, this evq needs {d['expected']}"
        + ("" if d["at_head"] else " — run `evq db upgrade`"),
    )
    return 0 if current == head else 5
