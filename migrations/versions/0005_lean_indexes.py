"""Fewer index entries per step: the status index skips in-flight rows; evidence loses its run index.

Revision ID: 0005_lean_indexes
Revises: 0004_prune
Create Date: 2026-11-30

Every state change of a step rewrites its row (status is indexed, so the update is
never HOT), and a rewritten row gets an entry in every index whose predicate it
matches. A step's life is pending -> in_flight -> accepted: two rewrites.
- ix_email_steps_status_created_at now leaves out in_flight rows, which nothing
  reads through it (the rescuer has ix_email_steps_lease_expiry; the recorder goes by
  primary key). The claim's rewrite no longer adds an entry there; every status a
  query counts or lists through it (pending, retryable, unknown, accepted,
  rejected) is still in it, so the collector's counts and prune's range stay
  index-only.
- ix_evidence_run_id_id is gone: a run's evidence is read through its steps
  (uq_email_steps_run_id_step_id, then ix_evidence_step_id_id); evidence.run_id is
  always its step's run_id. Two evidence rows per step no longer pay for it.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_lean_indexes"
down_revision: str | Sequence[str] | None = "0004_prune"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_email_steps_status_created_at", table_name="email_steps")
    op.create_index(
        "ix_email_steps_status_created_at",
        "email_steps",
        ["status", "created_at"],
        unique=False,
        postgresql_where=sa.text("status <> 'in_flight'"),
    )
    op.drop_index("ix_evidence_run_id_id", table_name="evidence")


def downgrade() -> None:
    op.create_index("ix_evidence_run_id_id", "evidence", ["run_id", "id"], unique=False)
    op.drop_index(
        "ix_email_steps_status_created_at", table_name="email_steps", postgresql_where=sa.text("status <> 'in_flight'")
    )
    op.create_index("ix_email_steps_status_created_at", "email_steps", ["status", "created_at"], unique=False)
