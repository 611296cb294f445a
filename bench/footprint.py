"""What one drain costs the database, per step: WAL bytes, rows and index entries written, the
HOT share of the updates, read from PostgreSQL's own counters before and after the drain.

pg_stat_user_tables counts each table's inserts, updates (HOT among them) and deletes; every
insert and every update that is not HOT writes one entry into each index of its table, which
pg_index says how many there are. The WAL position is the server's: on a server other sessions
write to (a shared test machine) their WAL counts too, so the figure is an upper bound there.
The backends' own CPU is not read: the server's processes are not this process's children, and
on a shared server their total is everyone's."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

_TABLES = """
SELECT t.relname, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del,
       (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid) AS indexes
FROM pg_stat_user_tables t
"""


@dataclass(frozen=True)
class Snapshot:
    wal: int  # bytes, the server's insert position
    tables: dict[str, tuple[int, int, int, int, int]]  # ins, upd, hot, del, indexes


def snapshot(url: str, *, settle: float = 3.0) -> Snapshot:
    """The counters now, once every other backend on this database has gone (a backend reports
    its counts when it ends, at the latest): waits up to ``settle`` seconds for that."""
    with psycopg.connect(url, autocommit=True) as conn:
        until = time.monotonic() + settle
        while time.monotonic() < until:
            others = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            if not others:
                break
            time.sleep(0.05)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        wal = int(conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()[0])
        tables = {r[0]: tuple(int(x) for x in r[1:]) for r in conn.execute(_TABLES).fetchall()}
    return Snapshot(wal, tables)  # type: ignore[arg-type]


def per_step(before: Snapshot, after: Snapshot, steps: int) -> dict[str, Any]:
    """The drain's cost per step, from two snapshots around it."""
    rows = index_entries = updates = hot = 0
    for name, (ins, upd, h, dele, indexes) in after.tables.items():
        b = before.tables.get(name, (0, 0, 0, 0, indexes))
        d_ins, d_upd, d_hot, d_del = ins - b[0], upd - b[1], h - b[2], dele - b[3]
        rows += d_ins + d_upd + d_del
        index_entries += (d_ins + d_upd - d_hot) * indexes
        updates += d_upd
        hot += d_hot
    return {
        "wal_bytes": (after.wal - before.wal) / steps,
        "rows": rows / steps,
        "index_entries": index_entries / steps,
        "hot_share": hot / updates if updates else 0.0,
    }
