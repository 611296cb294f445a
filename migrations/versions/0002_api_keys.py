"""API keys: named, with a role, stored as salted hashes.

Revision ID: 0002_api_keys
Revises: 0001
Create Date: 2026-11-29

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0002_api_keys"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "api_keys",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column("created_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=True),
        sa.Column("revoked_at", postgresql.TIMESTAMP(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
        sa.CheckConstraint("role IN ('agent', 'operator', 'admin')", name=op.f("ck_api_keys_role")),
        sa.CheckConstraint("key_id ~ '^[0-9a-f]{12}$'", name=op.f("ck_api_keys_key_id_format")),
        sa.CheckConstraint("secret_hash LIKE 'scrypt$%'", name=op.f("ck_api_keys_secret_hash_scheme")),
        sa.CheckConstraint(
            "revoked_by IS NULL OR revoked_at IS NOT NULL", name=op.f("ck_api_keys_revoked_by_when_revoked")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_id", name=op.f("uq_api_keys_key_id")),
        sa.UniqueConstraint("name", name=op.f("uq_api_keys_name")),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table("api_keys")
