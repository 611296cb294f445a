"""The provider's idempotency key is keyed by this installation's secret; steps enqueued before keep theirs (issue 29).

Revision ID: 0027_wire_keys
Revises: 0025_partition_drop_lock
Create Date: 2026-12-07

The HTTP adapter sent a step's idempotency key to the provider as it was (``Idempotency-Key``),
or ``sha256:`` and its digest when long or not ASCII. Keys are the callers' to choose, so an
agent could take another step's key at the provider first (the literal key ``sha256:<digest of
the victim's key>``: the victim's send met "same key, different body" and was lost), and two
installations sharing one provider account collided on every key they both used. The adapter
now sends an HMAC of the step's key under a secret derived from ``api_key_pepper`` (0010), which
no caller knows and each installation has its own of.

A step attempted before this revision may have reached the provider under its old key, and a
new key inside the provider's dedupe window would be a second send. So the steps that exist
now keep the old form for every later attempt: ``api_key_pepper.wire_keys_from`` is the first
step id that takes the keyed form, the id the steps sequence hands out next. It is read from
the sequence, not from the table, so a step some transaction was writing while this ran (its
id taken, not yet committed) counts as one from before. Steps enqueued later take the keyed
form from their first attempt. Old workers must be stopped before the upgrade, as for any
migration: one still running would send a new step under its old key.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027_wire_keys"
down_revision: str | Sequence[str] | None = "0026_step_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_key_pepper", sa.Column("wire_keys_from", sa.BigInteger(), nullable=True))
    # The sequence's last value counts every id handed out, to a transaction not yet committed
    # or cached by a session too; NULL before the first.
    op.execute(
        """
        UPDATE api_key_pepper
        SET wire_keys_from = coalesce(
            pg_sequence_last_value(pg_get_serial_sequence('email_steps', 'id')::regclass) + 1, 1)
        """
    )
    op.alter_column("api_key_pepper", "wire_keys_from", nullable=False)
    op.create_check_constraint(
        op.f("ck_api_key_pepper_wire_keys_from_positive"), "api_key_pepper", "wire_keys_from >= 1"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_api_key_pepper_wire_keys_from_positive"), "api_key_pepper", type_="check")
    op.drop_column("api_key_pepper", "wire_keys_from")
