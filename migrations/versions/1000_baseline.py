"""evq 1.0's schema, whole: the baseline every later revision starts from.

Revision ID: 1000_baseline
Revises:
Create Date: 2026-12-08

The 25 revisions written between 0.2.0 and 1.0 (0001 to 0027, several fixing each other) are
folded into this one; no release outside the repository shipped them. A database 0.2.0 made
(revision 0012_step_guard) is upgraded by a one-time copy into this baseline
(migrations/from_0_2.py, run by `evq admin db-upgrade`); one at any other 00NN revision is
refused.

What it runs, in this order, from migrations/baseline/:

- search.sql: evq_recipient_keys, the function the search index is built on;
- tables.sql: every table, constraint and index, rendered from adapters/postgres/schema.py
  (`python -m evq.migrations.render`): the model is their one source;
- views.sql: steps_now, a step with the attempt its queue row holds (every reader's view);
- append_only.sql, guards.sql, key_events.sql: the triggers that keep history append-only,
  a step's request fixed and a closed step closed, and each key's event feed written;
- prune.sql, partitions.sql: retention (prune, content redaction, evidence partitions) and
  the first evidence partitions;
- roles.sql: evq_grant_runtime, what the runtime role is granted;

then the pepper. Every function keeps the search path it was made with (evq's schema, then
pg_temp; pg_catalog first): SET search_path FROM CURRENT, set here.

Self-contained: it reads its own SQL files and imports no application code.
"""

import re
import secrets
from collections.abc import Sequence
from pathlib import Path

from alembic import op

revision: str = "1000_baseline"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BASELINE = Path(__file__).resolve().parent.parent / "baseline"
FILES = (
    "search.sql",
    "tables.sql",
    "views.sql",
    "append_only.sql",
    "guards.sql",
    "key_events.sql",
    "prune.sql",
    "partitions.sql",
    "roles.sql",
)


def _driver():
    # The files hold many statements, and % and : in function bodies: psycopg runs a text
    # without parameters as it is (simple query protocol), in the migration's transaction.
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    db = _driver()
    encoding = db.execute("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()")
    [(name,)] = encoding.fetchall()
    if name not in ("UTF8", "SQL_ASCII"):
        # ix_step_keys_key_sha256 hashes a key's bytes in the database's encoding, and
        # webhooks echo the SHA-256 of its UTF-8 bytes.
        raise RuntimeError(f"evq needs a UTF8 database (this one is {name}): a key's digest is of its UTF-8 bytes")
    [(before,)] = db.execute("SELECT current_setting('search_path')").fetchall()
    db.execute("SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true)")
    for name in FILES:
        db.execute((BASELINE / name).read_text())
    # The one random server-side secret key HMACs, callback signatures and the HTTP adapter's
    # idempotency keys are derived from. Every step of this database takes the keyed wire key
    # (wire_keys_from 1): none was sent under another.
    db.execute("INSERT INTO api_key_pepper (id, pepper, wire_keys_from) VALUES (1, %s, 1)", (secrets.token_bytes(32),))
    db.execute("SELECT set_config('search_path', %s, true)", (before,))


def downgrade() -> None:
    # Everything the files made, by name: evq may share its schema with other tables. Tables
    # first (their triggers, indexes and partitions go with them), then the functions.
    db = _driver()
    for table in reversed(_created("TABLE")):
        db.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
    for function in _created("FUNCTION"):
        db.execute(f'DROP FUNCTION IF EXISTS "{function}"')


def _created(kind: str) -> list[str]:
    pattern = re.compile(rf"^CREATE {kind} (\w+)", re.M)
    return [m for name in FILES for m in pattern.findall((BASELINE / name).read_text())]
