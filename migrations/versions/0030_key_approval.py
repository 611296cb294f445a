"""Each API key says whether its sends wait for a person: always, policy or never (issue 30).

Revision ID: 0030_key_approval
Revises: 0027_wire_keys
Create Date: 2026-12-08

- ``api_keys.approval``: ``always`` (every send the key enqueues is held for a person),
  ``policy`` (the installation's EVQ_APPROVAL_* and EVQ_BUDGET_* rules, as every send had
  before) or ``never`` (no rule asks for a person; the budgets still cap it). The rule that
  reads it is worker/approval.py; evq keys create gives an agent key ``always`` and an
  operator or admin key ``policy`` unless the admin says otherwise.
- Keys that exist now: an agent key becomes ``always`` (fail closed: an agent's send waits
  for a person, as the agent harness rule asks), an operator or admin key ``policy`` (what it
  had). An admin who wants an agent to keep sending unattended says so per key:
  ``evq keys update NAME --approval policy`` (or ``never``).
- No server default: every writer states it (the store's create_key does), so a writer that
  forgets is refused rather than given a policy nobody chose.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0030_key_approval"
down_revision: str | Sequence[str] | None = "0027_wire_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("approval", sa.Text(), nullable=True))
    op.execute("UPDATE api_keys SET approval = CASE WHEN role = 'agent' THEN 'always' ELSE 'policy' END")
    op.alter_column("api_keys", "approval", nullable=False)
    op.create_check_constraint(op.f("ck_api_keys_approval"), "api_keys", "approval IN ('always', 'policy', 'never')")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_api_keys_approval"), "api_keys", type_="check")
    op.drop_column("api_keys", "approval")
