"""API keys checked by HMAC-SHA256 with a server-side pepper; sessions that can end.

Revision ID: 0010_key_hmac
Revises: 0009_runtime_role
Create Date: 2026-12-01

Before this revision every key check ran scrypt (16 MiB, tens of milliseconds), so a
flood of wrong keys, which needs no credentials, stalled `evq serve` for everyone.
evq's keys are 256 random bits: a keyed fast hash guards a stolen table as well as a
slow one does, and costs microseconds. Now:

- ``api_key_pepper`` holds one random 32-byte secret, made here; a key's
  ``secret_hash`` is ``hmac-sha256$<hex>`` of its secret under that pepper. The
  runtime role may only read it (``evq_grant_runtime`` is extended below), so the
  role that checks keys cannot replace it and invalidate every key at once. It can
  still write ``api_keys`` (keys are created, rehashed and revoked at run time), so it
  can make a key of its own: as before, whoever holds the database's credentials can;
- keys made before keep their ``scrypt$...`` hash and still work; the first
  successful check rehashes them to HMAC (the CHECK allows both schemes);
- ``api_keys.session_generation`` is bumped when someone signs out of the ops page:
  a session cookie carries the generation it was made under and is refused once it
  changed, so signing out ends the session on the server, not only in the browser.

Self-contained on purpose (no application imports).
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010_key_hmac"
down_revision: str | Sequence[str] | None = "0009_runtime_role"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# evq_grant_runtime (0009) grants by table name; the pepper is read-only for the runtime.
# The function is edited in place (its own text, read back from the catalogue) rather
# than copied here, so another revision's edits to it are kept.
_MARKER = "WHEN 'prune_log' THEN 'SELECT'"
_PEPPER_LINE = (
    "WHEN 'api_key_pepper' THEN 'SELECT'            -- read by key checks, written by migrations only\n            "
)


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def upgrade() -> None:
    op.create_table(
        "api_key_pepper",
        sa.Column("id", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("pepper", postgresql.BYTEA(), nullable=False),
        sa.Column("created_at", postgresql.TIMESTAMP(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_api_key_pepper_one_row")),
        sa.CheckConstraint("octet_length(pepper) >= 32", name=op.f("ck_api_key_pepper_long_enough")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_key_pepper")),
    )
    op.get_bind().execute(
        sa.text("INSERT INTO api_key_pepper (id, pepper) VALUES (1, :pepper)"), {"pepper": secrets.token_bytes(32)}
    )
    op.add_column(
        "api_keys", sa.Column("session_generation", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.drop_constraint(op.f("ck_api_keys_secret_hash_scheme"), "api_keys", type_="check")
    op.create_check_constraint(
        op.f("ck_api_keys_secret_hash_scheme"),
        "api_keys",
        "secret_hash LIKE 'scrypt$%' OR secret_hash LIKE 'hmac-sha256$%'",
    )
    definition = _grant_function()
    if "'api_key_pepper'" not in definition:
        if _MARKER not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _PEPPER_LINE + _MARKER, 1))


def downgrade() -> None:
    definition = _grant_function()
    op.execute(definition.replace(_PEPPER_LINE, "", 1))
    op.drop_constraint(op.f("ck_api_keys_secret_hash_scheme"), "api_keys", type_="check")
    # A key rehashed to HMAC cannot go back to scrypt (its secret is not stored): it stops
    # working, and its row (its name, never reused, is an actor in evidence) stays.
    op.execute(
        "UPDATE api_keys SET secret_hash = 'scrypt$rehashed-by-0010_key_hmac' WHERE secret_hash NOT LIKE 'scrypt$%'"
    )
    op.create_check_constraint(op.f("ck_api_keys_secret_hash_scheme"), "api_keys", "secret_hash LIKE 'scrypt$%'")
    op.drop_column("api_keys", "session_generation")
    op.drop_table("api_key_pepper")
