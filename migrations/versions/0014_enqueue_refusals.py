"""Refused enqueues are recorded, and counted across every process.

Revision ID: 0014_enqueue_refusals
Revises: 0013_content_retention
Create Date: 2026-12-01

- ``enqueue_refusals``: one row per refused enqueue (worker/refusals.py says what is
  kept: identifiers, the failing fields, the key's name, a digest and size of what
  was asked; never the body, never the key). `evq prune` deletes old rows.
- ``enqueue_refusal_counts``: per (interface, field) the number of refusals ever
  recorded, incremented with each row and never pruned: the counter
  ``evq_enqueue_refusals_total`` the metrics collector reads, whichever process refused.
- a trigger refuses any UPDATE of a count that lowers it or moves it to another label:
  the runtime role needs UPDATE for the increment, and a counter that can go down is
  not one (Prometheus would read a reset).
- ``evq_grant_runtime`` names both, so the runtime role may insert and delete (prune)
  refusals but never rewrite one, and may increment the counts but never delete them.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0014_enqueue_refusals"
down_revision: str | Sequence[str] | None = "0013_content_retention"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = postgresql.TIMESTAMP(timezone=True)

# evq_grant_runtime (0009) grants by table name; it is edited in place (its own text,
# read back from the catalogue), as 0010 and 0011 do, so their edits are kept.
_MARKER = "WHEN 'prune_log' THEN 'SELECT'"
_LINES = (
    "WHEN 'enqueue_refusals' THEN 'SELECT, INSERT, DELETE'  -- recorded, pruned, never rewritten\n            "
    "WHEN 'enqueue_refusal_counts' THEN 'SELECT, INSERT, UPDATE'  -- a counter: only grows\n            "
)


COUNT_GUARD = """
CREATE FUNCTION evq_refusal_count_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.interface IS DISTINCT FROM OLD.interface OR NEW.field IS DISTINCT FROM OLD.field
       OR NEW.total < OLD.total THEN
        RAISE EXCEPTION 'evq: the refusal count (%, %) only grows', OLD.interface, OLD.field
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$
"""


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def upgrade() -> None:
    op.create_table(
        "enqueue_refusals",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("interface", sa.Text(), nullable=False),
        sa.Column("key_name", sa.Text(), nullable=True),
        sa.Column("dry_run", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("request_bytes", sa.BigInteger(), nullable=False),
        sa.Column("request_sha256", sa.Text(), nullable=False),
        sa.Column("errors", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("error_count", sa.Integer(), nullable=False),
        sa.Column("reasons", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("asked", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.CheckConstraint("interface IN ('cli', 'http', 'mcp', 'python')", name=op.f("ck_enqueue_refusals_interface")),
        sa.CheckConstraint(
            "requests >= 0 AND request_bytes >= 0 AND error_count >= 0",
            name=op.f("ck_enqueue_refusals_counts_nonnegative"),
        ),
        sa.CheckConstraint("length(request_sha256) = 64", name=op.f("ck_enqueue_refusals_sha256_length")),
        sa.CheckConstraint(
            "pg_column_size(errors) + pg_column_size(asked) <= 65536", name=op.f("ck_enqueue_refusals_bounded")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enqueue_refusals")),
    )
    op.create_index(op.f("ix_enqueue_refusals_created_at"), "enqueue_refusals", ["created_at"], unique=False)
    op.create_table(
        "enqueue_refusal_counts",
        sa.Column("interface", sa.Text(), nullable=False),
        sa.Column("field", sa.Text(), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("total >= 0", name=op.f("ck_enqueue_refusal_counts_total_nonnegative")),
        sa.PrimaryKeyConstraint("interface", "field", name=op.f("pk_enqueue_refusal_counts")),
    )
    op.execute(COUNT_GUARD)
    op.execute(
        "CREATE TRIGGER enqueue_refusal_counts_only_grow BEFORE UPDATE ON enqueue_refusal_counts "
        "FOR EACH ROW EXECUTE FUNCTION evq_refusal_count_guard()"
    )
    definition = _grant_function()
    if "'enqueue_refusals'" not in definition:
        if _MARKER not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _LINES + _MARKER, 1))


def downgrade() -> None:
    op.execute(_grant_function().replace(_LINES, "", 1))
    op.drop_table("enqueue_refusal_counts")  # its trigger goes with it
    op.execute("DROP FUNCTION IF EXISTS evq_refusal_count_guard()")
    op.drop_index(op.f("ix_enqueue_refusals_created_at"), table_name="enqueue_refusals")
    op.drop_table("enqueue_refusals")
