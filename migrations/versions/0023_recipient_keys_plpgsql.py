"""evq_recipient_keys in PL/pgSQL: its plan kept for the session, not made again in every statement (issue 19).

Revision ID: 0023_recipient_keys_plpgsql
Revises: 0022_evidence_partitions
Create Date: 2026-12-02

``ix_email_steps_recipient_keys`` (0019) is an expression index over a SQL function whose
body has a FROM and an aggregate, so the planner cannot inline it: each statement that
evaluates it (every insert, and every update that is not HOT: the claim's and the record's,
whose status changes) parsed and planned the body again on its first row, about 80 us of
the server's time per statement. A single enqueue spent about a quarter of its time there
(p50 0.83 ms, 0.59 ms with the index dropped). The same query as a PL/pgSQL function is
planned once per session and its plan reused: 0.64 ms, the rows per statement cost as before
(about 9 us each against 8).

The body is the very query 0019 wrote (pg_catalog names only, so a restore with an empty
search_path builds the same index), so every payload gives the same keys in the same order:
the index stays valid and is not rebuilt. Still IMMUTABLE, STRICT and PARALLEL SAFE.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023_recipient_keys_plpgsql"
down_revision: str | Sequence[str] | None = "0022_evidence_partitions"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = """
    SELECT coalesce(pg_catalog.array_agg(DISTINCT k), '{}'::text[])
    FROM (
        SELECT pg_catalog.lower(r.value OPERATOR(pg_catalog.->>) 'email') AS e
        FROM pg_catalog.jsonb_array_elements(
            pg_catalog.jsonb_build_array()
            OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'to', '[]'::jsonb)
            OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'cc', '[]'::jsonb)
            OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'bcc', '[]'::jsonb)
        ) AS r
        WHERE pg_catalog.jsonb_typeof(r.value) = 'object'
    ) AS a
    CROSS JOIN LATERAL (VALUES (a.e), ('@' OPERATOR(pg_catalog.||) pg_catalog.split_part(a.e, '@', 2))) AS x(k)
    WHERE a.e IS NOT NULL AND a.e OPERATOR(pg_catalog.<>) ''
"""

PLPGSQL = f"""
CREATE OR REPLACE FUNCTION evq_recipient_keys(payload jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE STRICT AS $$
BEGIN
    RETURN ({_KEYS});
END
$$
"""

SQL = f"""
CREATE OR REPLACE FUNCTION evq_recipient_keys(payload jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $${_KEYS}$$
"""


def upgrade() -> None:
    op.execute(PLPGSQL)


def downgrade() -> None:
    # Changing a function's language with CREATE OR REPLACE keeps the index that depends on it.
    op.execute(SQL)
