"""The search by API key name reads its decisions and steps from indexes alone (issue 18).

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
- ``ix_email_steps_decision_id`` covers what a search needs of a step: ``INCLUDE (status,
  created_at, unknown_since, held_since, id)``. Those decisions' steps (``decision_id =
  ANY(...)``) were a bitmap heap scan: 50,000 heap pages, 120+ ms, to learn each one's state
  and times for the page's order and the tabs' counts; now an index-only scan (about 60 ms of
  index probes, no heap). It replaces the plain ``(decision_id)`` index, which the foreign
  key's reverse lookup (prune deleting decisions) still uses as it did. Its columns change
  only with the state, and the state is in other indexes already (no HOT update is lost).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021_search_key_ids"
down_revision: str | Sequence[str] | None = "0020_send_rollups"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


COVERED = ["status", "created_at", "unknown_since", "held_since", "id"]


def upgrade() -> None:
    op.drop_index("ix_email_steps_decision_id", table_name="email_steps")
    op.create_index("ix_email_steps_decision_id", "email_steps", ["decision_id"], postgresql_include=COVERED)
    op.drop_index("ix_decisions_actor", table_name="decisions")
    op.create_index("ix_decisions_actor", "decisions", ["actor", "id"], postgresql_where=sa.text("actor IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("ix_decisions_actor", table_name="decisions")
    op.create_index("ix_decisions_actor", "decisions", ["actor"], postgresql_where=sa.text("actor IS NOT NULL"))
    op.drop_index("ix_email_steps_decision_id", table_name="email_steps")
    op.create_index("ix_email_steps_decision_id", "email_steps", ["decision_id"])
