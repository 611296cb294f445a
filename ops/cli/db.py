"""evq db upgrade | status"""

from __future__ import annotations

import click

from evq.ops import wiring
from evq.ops.cli.auth import dry_run_option
from evq.ops.cli.common import command, database_option, load_settings, output_option
from evq.ops.cli.output import Output
from evq.worker.errors import SchemaMismatch


@click.group("db")
def db() -> None:
    """Create or migrate evq's tables (Alembic)."""


@db.command("upgrade")
@click.option(
    "--runtime-role",
    metavar="ROLE",
    default=None,
    help="Also grant this existing role exactly what workers, `evq serve` and `evq mcp` need (no ownership, "
    "no DDL, no UPDATE or DELETE of history). Every later upgrade grants it again.",
)
@dry_run_option
@output_option
@database_option
@command
def db_upgrade(out: Output, runtime_role: str | None, dry_run: bool, database_url: str | None) -> None:
    """Migrate the database to this evq's schema. Safe to run again; run it before
    starting workers of a new evq version. It needs the database's own credentials,
    not an API key (it runs before any key can exist), and must connect as the role
    that owns evq's tables: a role that does not is refused (E_AUTH_FAILED) before
    anything runs. Roles that were granted the runtime privileges get them again,
    so a table a new revision adds reaches them.

    \b
    evq db upgrade --runtime-role evq_app   # as the owner, e.g. postgresql://evq_owner@db/evq
    """
    from evq.adapters.postgres.database import current_revision, head_revision, migrate, pending_revisions

    url = wiring.database_url(load_settings(database_url=database_url))
    if dry_run:
        pending = pending_revisions(url)
        current = current_revision(url)
        out.success(
            {"dry_run": True, "revision": current, "target": head_revision(), "pending": pending},
            human=lambda d: (
                f"dry run: would apply {', '.join(d['pending'])}" if d["pending"] else "dry run: already current"
            ),
        )
        return
    before, after, granted = migrate(url, runtime_role=runtime_role)
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


@db.command("status")
@output_option
@database_option
@command
def db_status(out: Output, database_url: str | None) -> None:
    """Show the database's schema revision and the one this evq needs (E_SCHEMA_MISMATCH,
    exit 5, if they differ)."""
    from evq.adapters.postgres.database import UPGRADE_HINT, current_revision, head_revision, pending_revisions

    url = wiring.database_url(load_settings(database_url=database_url))
    current, head = current_revision(url), head_revision()
    if current != head:
        raise SchemaMismatch(
            f"database revision {current or '(none)'}, this evq needs {head}",
            hint=UPGRADE_HINT,
            context={"current": current, "expected": head, "pending": pending_revisions(url)},
        )
    out.success(
        {"revision": current, "expected": head, "at_head": True},
        human=lambda d: f"database revision {d['revision']}: current",
    )
