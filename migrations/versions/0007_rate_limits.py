"""Per-provider rate limits shared by every worker: one token bucket row per provider.

Revision ID: 0007_rate_limits
Revises: 0005_lean_indexes
Create Date: 2026-12-01

A limit kept in each process multiplies by the number of workers; this row is the
one place every worker on every host takes its tokens from (one atomic UPDATE,
refilled from the database clock). ``paused_until`` is set when the provider says we
send too fast (a 429 with Retry-After), so every worker stops claiming for it until
then. Rows appear on first use; no row means a full bucket and no pause.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007_rate_limits"
down_revision: str | Sequence[str] | None = "0005_lean_indexes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "provider_rate_limits",
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("paused_until", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.CheckConstraint("tokens >= 0", name=op.f("ck_provider_rate_limits_tokens_not_negative")),
        sa.PrimaryKeyConstraint("provider", name=op.f("pk_provider_rate_limits")),
    )


def downgrade() -> None:
    op.drop_table("provider_rate_limits")
