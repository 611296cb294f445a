"""The one-time upgrade of an evq 0.2.0 database to 1.0 (`evq admin db-upgrade` runs it).

0.2.0 was released with revisions 0001 to 0012_step_guard; 1.0 starts from one baseline
(versions/1000_baseline.py), so there is no chain of revisions from one to the other. Instead,
in one transaction:

1. the database must be at 0012_step_guard (checked under a lock on alembic_version); every
   0.2 table is locked, so a 0.2 process still writing is waited for (stop them first: a 0.2
   worker that keeps running after the upgrade would send under the old rules);
2. 0.2's tables (with their sequences, indexes and triggers) and functions move to a schema of
   their own, evq_0_2, which leaves evq's schema empty;
3. the baseline is created there, as on an empty database (``create_baseline``);
4. the rows are copied into it (from_0_2.sql, one block per table): steps in every state with
   every column, their evidence and decisions, keys with their hashes and 0.2's pepper, prune
   log, rate limits, circuits; the key ledger is rebuilt from the steps;
5. each role 0.2 granted the runtime privileges is granted 1.0's;
6. evq_0_2 is dropped, and alembic_version says 1000_baseline.

Anything that fails rolls all of it back: the database is as 0.2 left it. A database at
another 00NN revision (written between 0.2.0 and 1.0, never released) is refused unchanged.

What the upgrade cannot know: 0.2 kept no key ledger, so the idempotency keys of steps evq
prune removed under 0.2 are gone; a retry of one after the upgrade is a new send, as it would
have been under 0.2. prune_log still says how many steps went and their id ranges
(``pruned_steps_without_keys`` in the summary). The first-contact rule's memory
(known_recipients) starts empty, as on any installation that ran without an approval policy.

The owner role needs CREATE on the database (for the schema evq_0_2, made and dropped inside
the transaction). When the baseline's tables change, the copy in from_0_2.sql changes with them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

RELEASED = "0012_step_guard"  # 0.2.0's last revision
BASELINE = "1000_baseline"
ASIDE = "evq_0_2"

# What 0.2.0's revisions made, moved aside whole (a sequence moves with the table that owns it).
TABLES = (
    "alembic_version",
    "api_key_pepper",
    "api_keys",
    "decisions",
    "email_steps",
    "evidence",
    "prune_log",
    "provider_circuit_events",
    "provider_circuits",
    "provider_rate_limits",
)
FUNCTIONS = (
    "evq_append_only()",
    "evq_grant_runtime(name)",
    "evq_prune_batch(timestamptz, integer, text, uuid, integer)",
    "evq_prune_count(timestamptz)",
    "evq_step_guard()",
)
COPY = Path(__file__).resolve().parent / "from_0_2.sql"


class Refused(Exception):
    """The database is not one this upgrade takes; nothing was changed."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def development(revision: str | None) -> bool:
    """A revision written between 0.2.0 and 1.0 (00NN, but 0.2.0's own): never released."""
    return revision is not None and revision != RELEASED and re.fullmatch(r"00\d\d(_\w+)?", revision) is not None


def refusal(revision: str) -> Refused:
    return Refused(
        f"the database is at revision {revision}, made by a development version of evq between 0.2.0 and 1.0: "
        f"1.0 upgrades only a 0.2.0 database (revision {RELEASED}); nothing was changed",
        hint="make a new database with `evq admin db-upgrade`, or upgrade a copy of the database the 0.2.0 release made",
    )


def upgrade(connection: Any, create_baseline: Callable[[], None]) -> dict[str, Any]:
    """Upgrade a 0.2.0 database on ``connection`` (SQLAlchemy, inside the caller's transaction):
    ``create_baseline`` creates revision 1000_baseline on that same connection. Return what was
    copied, by table, and what could not be."""
    db = connection.connection.driver_connection
    with db.cursor() as cur:
        cur.execute("SELECT version_num FROM alembic_version FOR UPDATE")
        found = [r[0] for r in cur.fetchall()]
        if found != [RELEASED]:
            current = found[0] if found else "(none)"
            if development(current):
                raise refusal(current)
            raise Refused(
                f"the database is at revision {current}, not 0.2.0's {RELEASED}: nothing was changed",
                hint="run `evq admin db-upgrade` of the evq that made it",
            )
        # A 0.2 process writing now is waited for, a short while: then this one gives up.
        cur.execute("SET LOCAL lock_timeout = '10s'")
        cur.execute(f"LOCK TABLE {', '.join(t for t in TABLES if t != 'alembic_version')} IN ACCESS EXCLUSIVE MODE")
        # The roles 0.2 granted the runtime privileges (EXECUTE on evq_prune_batch is given by
        # evq_grant_runtime alone), granted 1.0's below.
        cur.execute(
            """
            SELECT r.rolname FROM pg_roles r
            WHERE r.rolname !~ '^pg_' AND NOT r.rolsuper
              AND has_function_privilege(r.oid, 'evq_prune_batch(timestamptz, integer, text, uuid, integer)', 'EXECUTE')
              AND NOT pg_has_role(r.oid, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'email_steps'::regclass),
                                  'MEMBER')
            ORDER BY r.rolname
            """
        )
        roles = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT coalesce(sum(steps), 0) FROM prune_log")
        [(pruned,)] = cur.fetchall()
        cur.execute(f"CREATE SCHEMA {ASIDE}")
        for table in TABLES:
            cur.execute(f"ALTER TABLE {table} SET SCHEMA {ASIDE}")
        for function in FUNCTIONS:
            cur.execute(f"ALTER FUNCTION {function} SET SCHEMA {ASIDE}")
    create_baseline()
    copied: dict[str, int] = {}
    with db.cursor() as cur:
        for name, block in _blocks(COPY.read_text()):
            cur.execute(block)
            rows = 0
            while True:  # a block may hold several statements: count the rows its writes wrote
                if (cur.statusmessage or "").startswith(("INSERT", "UPDATE")):
                    rows += max(cur.rowcount, 0)
                if not cur.nextset():
                    break
            copied[name] = rows
        for role in roles:
            cur.execute("SELECT evq_grant_runtime(%s)", (role,))
        cur.execute(f"DROP SCHEMA {ASIDE} CASCADE")
    return {
        "from": RELEASED,
        "copied": {k: v for k, v in copied.items() if k not in ("sequences", "evidence_partitions")},
        "pruned_steps_without_keys": int(pruned),
        "runtime_roles": roles,
    }


def _blocks(text: str) -> list[tuple[str, str]]:
    """The file's ``-- name: x`` blocks, in order."""
    parts = re.split(r"^-- name: (\w+)\n", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]
