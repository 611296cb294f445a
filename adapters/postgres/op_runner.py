"""An operation on the database written once for sync and async callers (an :data:`Op`): a
generator that yields a statement and its parameters (or an :class:`Each`, one statement per
parameter set) and is sent each statement's rows back. :func:`run_sync` drives it on a psycopg
connection, :func:`run_async` on an async one, with driver errors raised as evq's
(database.translated). So the Python API (enqueue.py, sync and async) and the store's async
pool (store/) run the same enqueue (single_enqueue.py, batch_enqueue.py) and notices
(notices.py), every line of their logic written once.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from evq.adapters.postgres.database import translated

Rows = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Each:
    """One statement run once per parameter set, in one round trip (psycopg's pipeline,
    ``executemany(returning=True)``): an op that yields one gets each run's rows, in order.
    For statements that do not depend on each other's rows."""

    statement: str
    params: Sequence[Mapping[str, Any]]


Op = Generator[tuple[str, Mapping[str, Any]] | Each, Any, Any]


def run_sync(conn: psycopg.Connection, op: Op) -> Any:
    with translated(), conn.cursor(row_factory=dict_row) as cur:
        try:
            step = next(op)
            while True:
                if isinstance(step, Each):
                    step = op.send(_each_sync(cur, step))
                    continue
                statement, params = step
                cur.execute(statement, params)
                step = op.send(cur.fetchall() if cur.description else [])
        except StopIteration as done:
            return done.value


def _each_sync(cur: psycopg.Cursor[Any], each: Each) -> list[Rows]:
    if not each.params:
        return []
    cur.executemany(each.statement, each.params, returning=True)
    out = []
    while True:
        out.append(cur.fetchall() if cur.description else [])
        if not cur.nextset():
            return out


async def run_async(conn: psycopg.AsyncConnection, op: Op) -> Any:
    with translated():
        async with conn.cursor(row_factory=dict_row) as cur:
            try:
                step = next(op)
                while True:
                    if isinstance(step, Each):
                        step = op.send(await _each_async(cur, step))
                        continue
                    statement, params = step
                    await cur.execute(statement, params)
                    step = op.send(await cur.fetchall() if cur.description else [])
            except StopIteration as done:
                return done.value


async def _each_async(cur: psycopg.AsyncCursor[Any], each: Each) -> list[Rows]:
    if not each.params:
        return []
    await cur.executemany(each.statement, each.params, returning=True)
    out = []
    while True:
        out.append(await cur.fetchall() if cur.description else [])
        if not cur.nextset():
            return out
