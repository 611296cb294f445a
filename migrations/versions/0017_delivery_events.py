"""Delivery events: what providers' webhooks say became of a message (issue 16).

Revision ID: 0017_delivery_events
Revises: 0016_worker_heartbeats
Create Date: 2026-12-01

- ``delivery_events``: one row per verified webhook event (worker/delivery.py), append-only,
  deduplicated by ``(provider, event_id)``; ``step_id`` is the step it matched, NULL when
  none did (kept for an operator, never dropped). No foreign key to email_steps: like
  key_events, pruning a step keeps what its provider said.
- ``ix_email_steps_key_sha256``: a hash index over the SHA-256 of the key's bytes, the digest
  evq puts on a message as the ``evq_key`` tag, so an event is matched by digest in one probe.
  The expression is built-ins only, all IMMUTABLE: ``decode(replace(key, '\\', '\\\\'), 'escape')``
  is the key's bytes in the database's encoding (``text::bytea`` would read backslash escapes
  and hash other bytes; ``convert_to`` is only STABLE, and wrapping it in an IMMUTABLE SQL
  function doubled the index's cost at insert, a function call per row). Those bytes are the
  UTF-8 ones in a UTF8 (or SQL_ASCII, fed by UTF-8 clients) database: any other encoding is
  refused. Nothing is added to the enqueue statement; measured on a 2-core machine, 300,000
  single-statement inserts into a copy of the key columns cost about 3 to 5 µs more per row
  (6 µs without it), and the index is about 35 bytes a row. Hash, not B-tree: equality is all
  it is asked, and it is half the size.
- evidence kind ``delivery_event``: every event matched to a step is evidence on it.
- ``evq_grant_runtime`` names the new table (SELECT, INSERT: append-only).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017_delivery_events"
down_revision: str | Sequence[str] | None = "0016_worker_heartbeats"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = postgresql.TIMESTAMP(timezone=True)

KINDS_BEFORE = (
    "attempt_started",
    "provider_response",
    "late_response",
    "attempt_released",
    "lease_expired",
    "window_closed",
    "reconciled",
    "operator_resolved",
    "notice_enqueued",
    "content_redacted",
)
KINDS = (*KINDS_BEFORE, "delivery_event")
TYPES = ("delivered", "deferred", "bounced_hard", "bounced_soft", "complained", "opened", "clicked")

_MARKER = "WHEN 'prune_log' THEN 'SELECT'"
_LINE = "WHEN 'delivery_events' THEN 'SELECT, INSERT'  -- append-only\n            "

# The SHA-256 of the key's bytes (queries.sql's delivery_record uses the very same expression).
KEY_SHA256 = r"sha256(decode(replace(idempotency_key, '\', '\\'), 'escape'))"
_ENCODINGS = ("UTF8", "SQL_ASCII")


def _kinds(values: Sequence[str]) -> str:
    return "kind IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def upgrade() -> None:
    op.create_table(
        "delivery_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("event_id", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("occurred_at", TZ, nullable=True),
        sa.Column("received_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("step_id", sa.BigInteger(), nullable=True),
        sa.Column("key_digest", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("provider_message_id", sa.Text(), nullable=True),
        sa.Column("recipient", sa.Text(), nullable=True),
        sa.Column(
            "detail", postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.CheckConstraint(
            "type IN (" + ", ".join(f"'{t}'" for t in TYPES) + ")", name=op.f("ck_delivery_events_type")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_events")),
        sa.UniqueConstraint("provider", "event_id", name=op.f("uq_delivery_events_provider_event_id")),
    )
    op.create_index(op.f("ix_delivery_events_step_id_id"), "delivery_events", ["step_id", "id"], unique=False)
    op.create_index(
        "ix_delivery_events_unmatched",
        "delivery_events",
        ["id"],
        unique=False,
        postgresql_where=sa.text("step_id IS NULL"),
    )
    op.execute(
        "CREATE TRIGGER delivery_events_append_only BEFORE UPDATE OR DELETE ON delivery_events "
        "FOR EACH ROW EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER delivery_events_no_truncate BEFORE TRUNCATE ON delivery_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )
    encoding = (
        op.get_bind()
        .execute(sa.text("SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()"))
        .scalar_one()
    )
    if encoding not in _ENCODINGS:
        raise RuntimeError(
            f"evq needs a UTF8 database (this one is {encoding}): a key's digest is the SHA-256 of its UTF-8 bytes"
        )
    op.execute(f"CREATE INDEX ix_email_steps_key_sha256 ON email_steps USING hash (({KEY_SHA256}))")
    op.drop_constraint(op.f("ck_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(op.f("ck_evidence_kind"), "evidence", _kinds(KINDS))
    definition = _grant_function()
    if "'delivery_events'" not in definition:
        if _MARKER not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _LINE + _MARKER, 1))


def downgrade() -> None:
    op.execute(_grant_function().replace(_LINE, "", 1))
    # Evidence of delivery events stays (append-only): the old constraint could not hold it.
    op.drop_constraint(op.f("ck_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(op.f("ck_evidence_kind"), "evidence", _kinds(KINDS))
    op.drop_index("ix_email_steps_key_sha256", table_name="email_steps")
    op.execute("DROP TRIGGER IF EXISTS delivery_events_append_only ON delivery_events")
    op.execute("DROP TRIGGER IF EXISTS delivery_events_no_truncate ON delivery_events")
    op.drop_index(
        "ix_delivery_events_unmatched", table_name="delivery_events", postgresql_where=sa.text("step_id IS NULL")
    )
    op.drop_index(op.f("ix_delivery_events_step_id_id"), table_name="delivery_events")
    op.drop_table("delivery_events")
