"""Database roles: the owner migrates, the runtime role only runs (invariant 11).

``evq db upgrade`` runs as the role that owns evq's tables; workers, ``evq serve``
and ``evq mcp`` connect as a runtime role granted exactly what they need by
``evq_grant_runtime`` (migrations/baseline/roles.sql): no ownership, no DDL, no DELETE
of steps and no UPDATE or DELETE of history outside ``evq_prune_batch``. Every
upgrade grants again every role granted before, so a table a later revision adds
reaches them; a migration run by a role that does not own the schema is refused
with an explanation instead of failing half-way on a permission error.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import errors as pgerr
from psycopg.rows import dict_row

from evq.adapters.postgres.queries import Q
from evq.worker.errors import Forbidden, InvalidRequest

OWNER_HINT = (
    "run `evq db upgrade` with the owner role's EVQ_DATABASE_URL; workers, `evq serve` and `evq mcp` keep "
    "the runtime role's (docs/guides/database-roles.md)"
)


def migrator(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Who is connected, who owns evq's tables, and whether this role may migrate."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(Q["schema_migrator"]).fetchone()
    assert row is not None
    return row


def refuse_unless_owner(who: dict[str, Any]) -> None:
    if who["may_migrate"]:
        return
    if who["owner"] is None:
        raise Forbidden(
            f"`evq db upgrade` connects as {who['role']}, which may not create tables in schema "
            f"{who['schema'] or '(none on the search_path)'}: nothing was migrated",
            hint=OWNER_HINT,
            context={"role": who["role"], "schema": who["schema"]},
        )
    raise Forbidden(
        f"`evq db upgrade` connects as {who['role']}, which does not own evq's tables (their owner is "
        f"{who['owner']}): only the owner migrates, so nothing was migrated",
        hint=OWNER_HINT,
        context={"role": who["role"], "owner": who["owner"]},
    )


def grant_runtime(conn: psycopg.Connection[Any], extra: str | None = None) -> list[str]:
    """Grant the runtime privileges again to every role that had them, and to ``extra``."""
    with conn.cursor(row_factory=dict_row) as cur:
        roles = [r["role"] for r in cur.execute(Q["runtime_roles"]).fetchall()]
        if extra and extra not in roles:
            roles.append(extra)
        for role in roles:
            try:
                with conn.transaction():
                    cur.execute(Q["runtime_grant"], {"role": role})
            except (pgerr.UndefinedObject, pgerr.InvalidGrantOperation) as exc:
                # Our own messages (evq_grant_runtime's RAISE): a role name, never a secret.
                raise InvalidRequest(
                    [{"field": "--runtime-role", "message": exc.diag.message_primary or type(exc).__name__}],
                    hint=exc.diag.message_hint,
                ) from None
    return sorted(roles)
