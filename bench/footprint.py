"""What one drain costs the database, per step: WAL bytes, rows and index entries written, the
HOT share of the updates, read from PostgreSQL's own counters before and after the drain.

pg_stat_user_tables counts each table's inserts, updates (HOT among them) and deletes; every
insert and every update that is not HOT writes one entry into each index of its table, which
pg_index says how many there are. The WAL is this database's: pg_walinspect reads the records
written between the two snapshots, and those that touch this database's relations count, with
the commit records of their transactions (full-page images included); other sessions on a
shared server do not. While the drain runs, a temporary replication slot (:func:`wal_kept`) keeps
the server from recycling the WAL before it is read (a busy shared server fills max_wal_size in
seconds); it goes with its session. Without pg_walinspect or the slot (both need a superuser), the
server's WAL position is read instead, everyone's writes counted, and the figure says so.
The backends' own CPU is not read: the server's processes are not this process's children, and
on a shared server their total is everyone's."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

_TABLES = """
SELECT t.relname, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid) AS indexes
FROM pg_stat_user_tables t
"""


_WAL_OF_DATABASE = """
WITH r AS MATERIALIZED (
    SELECT xid, resource_manager, record_length, block_ref
    FROM pg_get_wal_records_info(%(start)s::pg_lsn, least(%(end)s::pg_lsn, pg_current_wal_flush_lsn()))
), mine AS (
    SELECT DISTINCT xid FROM r WHERE block_ref LIKE %(rel)s AND xid <> '0'
)
SELECT coalesce(sum(record_length), 0) FROM r
WHERE block_ref LIKE %(rel)s OR (resource_manager = 'Transaction' AND xid IN (SELECT xid FROM mine))
"""


@dataclass(frozen=True)
class Snapshot:
    wal: int  # bytes, the server's insert position
    tables: dict[str, tuple[int, int, int, int, int]]  # ins, upd, hot, del, indexes
    lsn: str = ""
    walinspect: bool = False


@contextlib.contextmanager
def wal_kept(url: str) -> Iterator[None]:
    """Keep the server's WAL from here until the block ends (a temporary physical replication
    slot reserving it, dropped with this session however the block ends), when the role may."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("SELECT pg_create_physical_replication_slot(%s, true, true)", (f"evq_bench_{id(conn)}",))
        except psycopg.Error:
            pass  # not a superuser or no slots free: the WAL may be recycled, and is then not read
        yield


def snapshot(url: str, *, settle: float = 3.0) -> Snapshot:
    """The counters now, once every other backend on this database has gone (a backend reports
    its counts when it ends, at the latest): waits up to ``settle`` seconds for that."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            walinspect = True
        except psycopg.Error:
            walinspect = False
        until = time.monotonic() + settle
        while time.monotonic() < until:
            others = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            if not others:
                break
            time.sleep(0.05)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        lsn, wal = conn.execute(
            "SELECT pg_current_wal_insert_lsn()::text, pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
        ).fetchone()
        tables = {r[0]: tuple(int(x) for x in r[1:]) for r in conn.execute(_TABLES).fetchall()}
    return Snapshot(int(wal), tables, lsn, walinspect)  # type: ignore[arg-type]


def database_wal(url: str, before: Snapshot, after: Snapshot) -> float | None:
    """Bytes of WAL this database's work wrote between the snapshots (pg_walinspect), or None."""
    if not (before.walinspect and after.walinspect):
        return None
    with psycopg.connect(url, autocommit=True) as conn:
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0]
        params = {"start": before.lsn, "end": after.lsn, "rel": f"% rel %/{oid}/%"}
        try:
            return float(conn.execute(_WAL_OF_DATABASE, params).fetchone()[0])
        except psycopg.errors.UndefinedFile:
            # The segments were recycled meanwhile (a busy shared server, a small max_wal_size):
            # the server's position is all there is.
            return None


def per_step(before: Snapshot, after: Snapshot, steps: int, *, wal: float | None = None) -> dict[str, Any]:
    """The drain's cost per step, from two snapshots around it; ``wal``: this database's WAL
    between them (:func:`database_wal`), else the server's is counted."""
    rows = index_entries = updates = hot = 0
    for name, (ins, upd, h, dele, indexes) in after.tables.items():
        b = before.tables.get(name, (0, 0, 0, 0, indexes))
        d_ins, d_upd, d_hot, d_del = ins - b[0], upd - b[1], h - b[2], dele - b[3]
        rows += d_ins + d_upd + d_del
        index_entries += (d_ins + d_upd - d_hot) * indexes
        updates += d_upd
        hot += d_hot
    return {
        "wal_bytes": (after.wal - before.wal if wal is None else wal) / steps,
        "wal_whose": "server" if wal is None else "database",
        "rows": rows / steps,
        "index_entries": index_entries / steps,
        "hot_share": hot / updates if updates else 0.0,
    }
