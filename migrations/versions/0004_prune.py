"""Retention: the prune log, and the one narrow exception to append-only.

Revision ID: 0004_prune
Revises: 0003_notices
Create Date: 2026-11-29

`evq prune` is the only path that removes evidence. The append-only trigger keeps
refusing every UPDATE and TRUNCATE, and every DELETE, except a DELETE made while
the transaction-local setting ``evq.pruning`` is on (the prune statement sets it
for its own transaction only) of evidence that belongs to a terminal step, or of
a decision whose step is being deleted in the same statement (the foreign key
refuses the rest). Each prune batch writes its prune_log row in the same
transaction as its deletes, so the log says exactly what was removed; the log
itself is append-only without exception.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004_prune"
down_revision: str | Sequence[str] | None = "0003_notices"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "prune_log",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("run", sa.UUID(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("cutoff", postgresql.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("evidence", sa.Integer(), nullable=False),
        sa.Column("decisions", sa.Integer(), nullable=False),
        sa.Column("first_step_id", sa.BigInteger(), nullable=True),
        sa.Column("last_step_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "steps >= 0 AND evidence >= 0 AND decisions >= 0", name=op.f("ck_prune_log_counts_nonnegative")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prune_log")),
        sa.UniqueConstraint("run", "batch", name=op.f("uq_prune_log_run_batch")),
    )
    op.execute(APPEND_ONLY_WITH_PRUNE)
    op.execute(
        "CREATE TRIGGER prune_log_append_only BEFORE UPDATE OR DELETE ON prune_log "
        "FOR EACH ROW EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER prune_log_no_truncate BEFORE TRUNCATE ON prune_log "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )


APPEND_ONLY_WITH_PRUNE = """
CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The one exception (evq prune): a DELETE of evidence or decisions while this
    -- transaction has evq.pruning on; evidence only when its step is terminal.
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' AND TG_TABLE_NAME IN ('evidence', 'decisions')
       AND coalesce(current_setting('evq.pruning', true), '') = 'on' THEN
        IF TG_TABLE_NAME = 'decisions' THEN
            RETURN OLD;  -- the foreign key keeps every decision a step still points at
        END IF;
        -- Planned only for evidence (decisions.step_id is text, not a step's id).
        IF EXISTS (SELECT 1 FROM email_steps s WHERE s.id = OLD.step_id AND s.status IN ('accepted', 'rejected')) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'evidence is never changed; append a new row instead (evq prune is the only way to remove old rows)';
END
$$
"""

APPEND_ONLY_ORIGINAL = """
CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege', HINT = 'evidence is never changed; append a new row instead';
END
$$
"""


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS prune_log_append_only ON prune_log")
    op.execute("DROP TRIGGER IF EXISTS prune_log_no_truncate ON prune_log")
    op.drop_table("prune_log")
    op.execute(APPEND_ONLY_ORIGINAL)
