"""Failure notices and the reconciler's bookkeeping on email_steps.

Revision ID: 0003_notices
Revises: 0002_api_keys
Create Date: 2026-12-01

- notice_of: a failure notice is itself an email step; this names the step it
  tells about. A notice never asks for a notice (CHECK), so a failing notice
  cannot start a chain.
- reconcile_after / reconcile_checks: when the reconciler may next ask the
  provider about an unknown row, and how often it has asked. Claiming a row for a
  lookup only moves reconcile_after forward, so no row lock is held while the
  provider answers.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003_notices"
down_revision: str | Sequence[str] | None = "0002_api_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("email_steps", sa.Column("notice_of", sa.BigInteger(), nullable=True))
    op.add_column("email_steps", sa.Column("reconcile_after", postgresql.TIMESTAMP(timezone=True), nullable=True))
    op.add_column("email_steps", sa.Column("reconcile_checks", sa.Integer(), server_default="0", nullable=False))
    op.create_foreign_key(
        op.f("fk_email_steps_notice_of_email_steps"), "email_steps", "email_steps", ["notice_of"], ["id"]
    )
    op.create_check_constraint(
        op.f("ck_email_steps_notice_never_notifies"), "email_steps", "notice_of IS NULL OR notify IS NULL"
    )
    op.create_check_constraint(
        op.f("ck_email_steps_reconcile_checks_nonnegative"), "email_steps", "reconcile_checks >= 0"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_email_steps_reconcile_checks_nonnegative"), "email_steps", type_="check")
    op.drop_constraint(op.f("ck_email_steps_notice_never_notifies"), "email_steps", type_="check")
    op.drop_constraint(op.f("fk_email_steps_notice_of_email_steps"), "email_steps", type_="foreignkey")
    op.drop_column("email_steps", "reconcile_checks")
    op.drop_column("email_steps", "reconcile_after")
    op.drop_column("email_steps", "notice_of")
