"""What every part of the PostgreSQL store shares: the pool and the one chokepoint.

Every call passes :meth:`PostgresBase._op`: it times the call into a histogram by
operation and outcome, logs it with the step identifiers bound, and translates driver
errors into evq errors. Pool connections run in autocommit: every operation is one
statement, atomic on its own, which saves the BEGIN/COMMIT round trips that would
otherwise double the cost of a small transaction. The few that need more than one
statement (a transition that owes a failure notice) run inside
:meth:`PostgresBase.transaction`, which pins one connection for every store call made
within it. The parts by port (queue.py, steps.py, ...) are mixins of this class, and
:class:`~evq.adapters.postgres.store.PostgresStore` is all of them over one pool.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any, Self

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from evq.adapters.postgres import isolation
from evq.adapters.postgres.conninfo import normalise
from evq.adapters.postgres.database import connect_kwargs, misconfigured, translate
from evq.adapters.postgres.queries import Q
from evq.worker import metrics
from evq.worker.notices import NoticeConfig
from evq.worker.ports import COUNT_CAP

# The connection of the store transaction the current task is inside, if any.
_PINNED: ContextVar[tuple[PostgresBase, psycopg.AsyncConnection] | None] = ContextVar("evq_pinned", default=None)


class PostgresBase:
    """The pool, the notices config, and the chokepoint every store call passes."""

    def __init__(self, pool: AsyncConnectionPool, *, notices: NoticeConfig = NoticeConfig()):
        self.pool = pool
        self.notices = notices

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        prepare: bool = True,
        notices: NoticeConfig = NoticeConfig(),
        patient: bool = True,
    ) -> Self:
        """``patient``: whether a server that does not answer (nothing listening, starting up,
        shutting down) is waited for, up to 15 s, as a worker restarting with its database wants;
        a one-shot command passes False and fails at once, as it does for a wrong database."""
        url = normalise(url)
        kwargs: dict[str, Any] = {**connect_kwargs(), "autocommit": True}
        # One direct connection first: a database that does not exist or refuses our login
        # is a clear error now, not a pool retrying it for 15 s. A server that is not
        # answering (refused, starting, shutting down) may be restarting: the pool waits,
        # unless the caller is not patient.
        try:
            probe = await psycopg.AsyncConnection.connect(url, **connect_kwargs())
        except psycopg.OperationalError as exc:
            if misconfigured(exc) or not patient:
                raise translate(exc, url) or exc from None
        else:
            await probe.close()
        if not prepare:
            # PgBouncer in transaction mode cannot keep server-side prepared statements.
            kwargs["prepare_threshold"] = None
        pool = AsyncConnectionPool(
            # A short wait for a connection: when the database is out of reach the caller
            # hears about it (and logs it) within seconds, instead of hanging silently.
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            open=False,
            name="evq",
            timeout=10,
        )
        try:
            await pool.open(wait=True, timeout=15)
            # Refused before any work when its transactions do not start READ COMMITTED.
            async with pool.connection() as conn:
                await isolation.require(conn)
        except Exception as exc:
            await pool.close()
            raise translate(exc, url) or exc from exc
        return cls(pool, notices=notices)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def _op(self, name: str) -> AsyncIterator[psycopg.AsyncConnection]:
        started = time.perf_counter()
        outcome = "ok"
        pinned = _PINNED.get()
        try:
            if pinned is not None and pinned[0] is self:
                yield pinned[1]
            else:
                async with self.pool.connection() as conn:
                    yield conn
        except BaseException as exc:
            outcome = "error"
            # The pool's URL, so a hint's createdb names this store's server (never its password).
            url = getattr(self.pool, "conninfo", None)
            mapped = translate(exc, url if isinstance(url, str) else None) if isinstance(exc, Exception) else None
            if mapped is not None and mapped is not exc:
                raise mapped from exc
            raise
        finally:
            metrics.labelled(metrics.STORE_SECONDS, name, outcome).observe(time.perf_counter() - started)

    def _pinned(self) -> bool:
        """Whether this task's calls run in a transaction of this store's (:meth:`transaction`)."""
        pinned = _PINNED.get()
        return pinned is not None and pinned[0] is self

    @asynccontextmanager
    async def transaction(self, name: str) -> AsyncIterator[psycopg.AsyncConnection]:
        """One transaction: every call on this store inside it (in this task) runs in it."""
        async with self._op(name) as conn, conn.transaction():
            token = _PINNED.set((self, conn))
            try:
                yield conn
            finally:
                _PINNED.reset(token)

    async def _fetch(self, name: str, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        async with self._op(name) as conn:
            return await fetch_all(conn, query, params)

    async def _page(
        self, name: str, page: str, count: str, params: Mapping[str, Any]
    ) -> tuple[list[dict[str, Any]], int]:
        """A list's page and its total (counted up to COUNT_CAP + 1) read from one snapshot, so
        the two agree. Two statements, not one: each keeps the plan it has alone (one statement
        doing both weighs more in the plan cache's choice, and its generic plan walked every key's
        feed for one key's page)."""
        async with self._snapshot(name) as conn:
            rows = await fetch_all(conn, page, params)
            [counted] = await fetch_all(conn, count, {**params, "count_cap": COUNT_CAP})
        return rows, counted["n"]

    @asynccontextmanager
    async def _snapshot(self, name: str) -> AsyncIterator[psycopg.AsyncConnection]:
        """A read-only transaction whose statements all see one snapshot."""
        async with self._op(name) as conn, conn.transaction():
            await conn.execute(Q["snapshot_read"])
            yield conn

    async def _tuned_read(
        self,
        name: str,
        settings: str,
        query: str,
        params: Mapping[str, Any],
        settings_params: Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """One read in a read-only transaction after ``settings``, a statement of SET LOCALs
        (set_config(..., true)): the page's lists and charts tune their own reads this way."""
        async with self._snapshot(name) as conn:
            await conn.execute(settings, settings_params or {})
            return await fetch_all(conn, query, params)


def json_text(value: Mapping[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


async def fetch_all(conn: psycopg.AsyncConnection, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, params)
        return await cur.fetchall() if cur.description else []
