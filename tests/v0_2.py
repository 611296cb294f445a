"""A database as evq 0.2.0 left it, for the tests of the one-time upgrade to 1.0
(migrations/from_0_2.py): 0.2.0's schema (tests/data/schema-0.2.sql, tests/data/README.md says
how it was made), stamped with its last revision, with the pepper its migration 0010 made."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import psycopg

from tests.support import valid

SCHEMA = Path(__file__).resolve().parent / "data" / "schema-0.2.sql"
REVISION = "0012_step_guard"
PEPPER = bytes(range(32))
EARLIER = "now() - interval '2 days'"  # SQL: a time before the upgrade


def database_0_2(url: str, *, revision: str = REVISION) -> None:
    """Load 0.2.0's schema into the empty database at ``url`` (its objects owned by the role
    ``url`` connects as), at ``revision``."""
    with psycopg.connect(url) as conn:
        conn.execute(SCHEMA.read_text())  # the dump sets search_path to '' for its session
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO alembic_version (version_num) VALUES (%s)", (revision,))
        conn.execute("INSERT INTO api_key_pepper (id, pepper) VALUES (1, %s)", (PEPPER,))


def key_hash(secret: str) -> str:
    """An API key's secret as 0.2.0 stored it: its HMAC-SHA256 under the pepper."""
    return "hmac-sha256$" + hmac.new(PEPPER, secret.encode(), hashlib.sha256).hexdigest()


def insert(conn: psycopg.Connection, table: str, row: dict[str, Any]) -> None:
    """One row; a value that is SQL text naming now() is written as SQL (a time relative to the
    database's clock), a payload as JSON."""
    sql = {k: v for k, v in row.items() if isinstance(v, str) and "now()" in v}
    marks = [sql[k] if k in sql else "%s::jsonb" if k == "payload" else "%s" for k in row]
    conn.execute(
        f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(marks)})",
        [v for k, v in row.items() if k not in sql],
    )


def step(conn: psycopg.Connection, id: int, name: str, status: str, **columns: Any) -> dict[str, Any]:
    """A step (and its decision) as 0.2.0 wrote it: the request its validator made (0.2's
    payload has the same fields), and the state ``columns`` give."""
    v = valid(run_id="from-0.2", step_id=name, to=[f"{name.replace('_', '-')}@example.com"])
    insert(conn, "decisions", {"id": id, "run_id": v.run_id, "step_id": v.step_id, "intent": "tell the user",
                                "model": "m-0.2", "tool": "send_email", "created_at": EARLIER})  # fmt: skip
    message_id = f"<{name.replace('_', '-')}.0-2@evq.example.org>"
    insert(conn, "email_steps", {
        "id": id, "run_id": v.run_id, "step_id": v.step_id, "decision_id": id, "idempotency_key": v.idempotency_key,
        "message_id": message_id, "provider": "smtp", "payload": v.payload_json, "payload_sha256": v.payload_sha256,
        "status": status, "created_at": EARLIER, "updated_at": "now()", **columns,
    })  # fmt: skip
    return {"id": id, "message_id": message_id, "key": v.idempotency_key, "sha": v.payload_sha256}


def evidence(conn: psycopg.Connection, step: int, kind: str, **columns: Any) -> None:
    insert(conn, "evidence", {"step_id": step, "run_id": "from-0.2", "kind": kind, "actor": "worker-0.2",
                               "created_at": EARLIER, **columns})  # fmt: skip
