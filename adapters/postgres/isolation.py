"""evq runs only under READ COMMITTED: the check every long-running process and every store
makes at start, and `evq admin health` reports.

evq's statements are written for READ COMMITTED, each seeing what committed before it: a claim
re-reads a row another worker just changed instead of failing, and retention's seal and drop
(migrations/baseline/partitions.sql) see a give-back committed while they waited for a partition. Under REPEATABLE
READ or SERIALIZABLE (``default_transaction_isolation`` set in postgresql.conf, on the database,
on the role or in the connection's options) they would not; the database functions that depend
on it refuse to run so, and this says so, with the remedy for where the setting came from,
before any work. It reads the connection it is given at that moment: behind a pooler in
transaction mode, another client's session SET can make one server connection differ, which
the functions' own refusal still catches later.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from evq.adapters.postgres.database import connect_kwargs, translated
from evq.adapters.postgres.queries import Q
from evq.worker.errors import ConfigError

# PostgreSQL's READ UNCOMMITTED is READ COMMITTED.
ACCEPTED = frozenset({"read committed", "read uncommitted"})


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def refusal(row: dict[str, Any]) -> ConfigError | None:
    """The error for an ``isolation_default`` row (queries.sql), or None when evq may run."""
    level, source = str(row["level"]), str(row["source"] or "")
    if level in ACCEPTED:
        return None
    role, database = _ident(str(row["role"])), _ident(str(row["database"]))
    # A setting of evq's own role in this database outranks postgresql.conf, the database's
    # and the role's own, and leaves every other role (the application sharing the database,
    # whose transactions evq may enqueue inside) as it is.
    own = f"ALTER ROLE {role} IN DATABASE {database} SET default_transaction_isolation = 'read committed'"
    where, hint = {
        "configuration file": ("postgresql.conf", own),
        "database": (f"the database ({database})", own),
        "user": (f"the role ({role})", f"ALTER ROLE {role} RESET default_transaction_isolation, or {own}"),
        "database user": (
            f"the role in this database ({role} in {database})",
            f"ALTER ROLE {role} IN DATABASE {database} RESET default_transaction_isolation",
        ),
        "client": (
            "the connection's options",
            "remove default_transaction_isolation from EVQ_DATABASE_URL's options= (or PGOPTIONS)",
        ),
        "session": (
            "a SET on this connection",
            "a pooler in transaction mode passed on another client's SET: that client must not SET "
            "default_transaction_isolation for its session (or set the pooler's server_reset_query)",
        ),
    }.get(source, (source or "the server", own))
    message = f"evq's transactions here start {level.upper()} (set by {where}); evq runs only under READ COMMITTED"
    return ConfigError(message, hint=hint, field="default_transaction_isolation")


def _raise(row: dict[str, Any] | None) -> None:
    refused = refusal(row or {})  # the query returns one row, always
    if refused is not None:
        raise refused


def check(url: str) -> None:
    """Raise :func:`refusal`'s error unless this URL's transactions start READ COMMITTED."""
    with translated(url), psycopg.connect(url, autocommit=True, row_factory=dict_row, **connect_kwargs()) as conn:
        _raise(conn.execute(Q["isolation_default"]).fetchone())


def check_on(conn: psycopg.Connection[Any]) -> None:
    """:func:`check` on a connection already open (a starting process's one check connection)."""
    _raise(conn.cursor(row_factory=dict_row).execute(Q["isolation_default"]).fetchone())


async def require(conn: psycopg.AsyncConnection) -> None:
    """:func:`check` on a connection a store's pool lent."""
    cur = await conn.cursor(row_factory=dict_row).execute(Q["isolation_default"])
    _raise(await cur.fetchone())
