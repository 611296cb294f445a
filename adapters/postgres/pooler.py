"""Is a connection pooler answering for PostgreSQL? Probed once at start (EVQ_POOLER=auto).

The test: a server tells each client its backend's process id in the BackendKeyData
message at login (psycopg's ``conn.info.backend_pid``), and ``pg_backend_pid()`` is
that same process. A pooler (PgBouncer, Odyssey, PgCat, ...) cannot pass the
server's key through, because a client is not tied to one server connection: it
makes up a key of its own, so the two differ. That holds for every pool mode and
needs no pooler-specific command or admin console.

Whether the pooler also shares one server connection between clients (transaction
or statement mode) is then shown, when it happens, by two client connections whose
statements run in the same backend; it is reported for the operator's log. evq
behaves as behind a transaction-mode pooler whenever any pooler answers: that costs
a session-mode pooler only prepared statements and LISTEN, while the opposite
mistake breaks statements (DuplicatePreparedStatement, parameters bound to another
client's statement) and, before the recorder retried everything, lost outcomes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import psycopg

from evq.adapters.postgres.database import connect_kwargs, translate
from evq.worker.errors import DatabaseUnavailable

PROBE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class PoolerProbe:
    pooled: bool  # the backend key the client got is not the server's: something pools
    shares_backends: bool  # two clients were seen in one backend (transaction or statement mode)


async def probe(url: str, *, tries: int = 3) -> PoolerProbe:
    """Raise an EvqError (DatabaseUnavailable, ...) when the database cannot be asked."""
    seen: list[bool] = []  # whether a pooler answers, once known
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            return await _probe(url, tries, seen)
    except TimeoutError as exc:
        if not seen:
            # The cause stays: a starting worker waits for a database that does not answer (ops/wiring.py).
            raise DatabaseUnavailable(f"the database did not answer within {PROBE_TIMEOUT:g}s") from exc
        # A pooler whose server connections are all busy makes a second client wait.
        return PoolerProbe(pooled=seen[0], shares_backends=False)
    except psycopg.Error as exc:
        mapped = translate(exc, url)
        if mapped is None:
            raise
        raise mapped from exc


async def _probe(url: str, tries: int, seen: list[bool]) -> PoolerProbe:
    kwargs = {**connect_kwargs(), "autocommit": True, "prepare_threshold": None}
    async with await psycopg.AsyncConnection.connect(url, **kwargs) as first:
        pid = await _backend(first)
        seen.append(pid != first.info.backend_pid)
        if not seen[0]:
            return PoolerProbe(pooled=False, shares_backends=False)
        async with await psycopg.AsyncConnection.connect(url, **kwargs) as second:
            for _ in range(tries):
                # A transaction-mode pooler hands the backend the first client just
                # released to the next client that asks (PgBouncer reuses the most recent one).
                if await _backend(first) == await _backend(second):
                    return PoolerProbe(pooled=True, shares_backends=True)
    return PoolerProbe(pooled=True, shares_backends=False)


async def _backend(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute("SELECT pg_backend_pid()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
