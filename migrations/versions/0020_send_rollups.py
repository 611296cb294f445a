"""The overview's send counts rolled up per minute (issue 18).

Revision ID: 0020_send_rollups
Revises: 0019_ops_search
Create Date: 2026-12-02

- ``send_rollups``: per minute x provider x what happened (``attempt`` for attempt_started,
  the four answers, ``no_answer`` for lease_expired to unknown), how many evidence rows. The
  charts read these for the window's complete, rolled-up minutes and the live evidence only
  for the rest, so a 24 h window reads about 1,440 x providers x 6 rows instead of every
  evidence row of the day. Derived data (the runtime role writes and deletes it; rows older
  than 7 days are deleted as the sampler writes).
- ``send_rollup_watermark``: one row: ``since`` (the first minute rolled up: the first run
  goes at most 24 h back, and pruning moves it) and ``upto`` (every minute before it is
  rolled up, empty minutes too, so they are never re-read). A read trusts rollups only in
  [since, upto) and counts evidence live outside that range.

Why a minute is rolled up only 2 minutes after it ended: ``evidence.created_at`` is the
recording statement's ``now()``, i.e. its transaction's start, and recording is one short
statement (milliseconds; the store's statement timeout is far below a minute). A row dated
minute m can only become visible after m ended by the length of that one statement, so once
two minutes have passed since m ended, every row dated m has committed (or never will), and
the count of m can no longer change.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020_send_rollups"
down_revision: str | Sequence[str] | None = "0019_ops_search"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "send_rollups",
        sa.Column("minute", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("provider", sa.Text, primary_key=True),
        sa.Column("outcome", sa.Text, primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.CheckConstraint("minute = date_trunc('minute', minute)", name="ck_send_rollups_minute"),
    )
    op.create_table(
        "send_rollup_watermark",
        sa.Column("id", sa.Boolean, primary_key=True, server_default=sa.true()),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("upto", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id", name="ck_send_rollup_watermark_one_row"),
    )


def downgrade() -> None:
    op.drop_table("send_rollup_watermark")
    op.drop_table("send_rollups")
