"""The search by API key name reads its decisions from the index alone (issue 18).

Revision ID: 0021_search_key_ids
Revises: 0020_send_rollups
Create Date: 2026-12-02

- ``ix_decisions_actor`` becomes ``(actor, id)``: the search box's key-name form needs the ids of
  every decision that key enqueued (each step has its own decision, so a busy key has as many
  as it has steps). On ``(actor)`` alone each id was a heap read of ``decisions``: 50,000 of
  them, about 100 ms, for a key with 50,000 steps. With the id in the index the read is an
  index-only scan (``decisions`` is append-only, so its pages stay all-visible once vacuumed):
  about 9 ms. It answers every query the old index did, so it replaces it rather than sitting
  beside it (one index to write per decision, as before).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_search_key_ids"
down_revision: str | Sequence[str] | None = "0020_send_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_decisions_actor", table_name="decisions")
    op.create_index("ix_decisions_actor", "decisions", ["actor", "id"], postgresql_where=sa.text("actor IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_decisions_actor", table_name="decisions")
    op.create_index("ix_decisions_actor", "decisions", ["actor"], postgresql_where=sa.text("actor IS NOT NULL"))
