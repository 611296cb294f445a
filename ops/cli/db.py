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
    done = wiring.migrate(url, runtime_role=runtime_role)
    data = {
        "dry_run": False,
        "revision_before": done.before,
        "revision": done.after,
        "changed": done.before != done.after,
        "runtime_roles": done.granted,
    }
    if done.from_0_2 is not None:
        data["from_0_2"] = done.from_0_2
    out.success(data, human=_upgraded)


def _upgraded(d: dict) -> str:
    line = f"database at revision {d['revision']}" + (
        f" (migrated from {d['revision_before'] or 'empty'})" if d["changed"] else " (already current)"
    )
    if d["runtime_roles"]:
        line += f"; runtime privileges granted to {', '.join(d['runtime_roles'])}"
    if "from_0_2" in d:
        copied = d["from_0_2"]["copied"]
        line += "\nupgraded from evq 0.2.0, once: " + ", ".join(f"{n} {table}" for table, n in copied.items())
        lost = d["from_0_2"]["pruned_steps_without_keys"]
        if lost:
            line += (
                f"\n{lost} steps pruned under 0.2 left no key behind (0.2 kept no key ledger): "
                "a retry of one of their keys is a new send"
            )
    return line


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
