"""Worker heartbeats: the trace `evq admin health` reads to say whether workers run.

Revision ID: 0016_worker_heartbeats
Revises: 0015_key_events
Create Date: 2026-12-01

- ``worker_heartbeats``: one row per running worker process (its owner name, the one
  its leases and evidence carry), upserted every few seconds while it runs and deleted
  when it stops; each beat also deletes rows not refreshed for a day (workers killed
  without a goodbye), so the table stays as small as the fleet. Operational state, not
  history: ``evq_grant_runtime`` grants tables it does not name SELECT, INSERT, UPDATE
  and DELETE, exactly what a worker needs here, so the function is not edited.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016_worker_heartbeats"
down_revision: str | Sequence[str] | None = "0015_key_events"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = postgresql.TIMESTAMP(timezone=True)


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("providers", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.Column("started_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("seen_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_worker_heartbeats")),
    )


def downgrade() -> None:
    op.drop_table("worker_heartbeats")
