"""Who asked for a send, and a per-key feed of what became of it (issue 15).

Revision ID: 0015_key_events
Revises: 0014_enqueue_refusals
Create Date: 2026-12-01

- ``decisions.actor`` / ``actor_key_id`` / ``interface``: the API key that enqueued
  the send (its name and public id, never its secret) and the interface it came
  through (cli, http, mcp, python). A Python API enqueue has no key: ``actor_key_id``
  is NULL and ``actor`` is whatever the caller named (maybe NULL).
- ``api_keys.notify_email`` / ``notify_url``: the key's default notification targets,
  told of a failure when the request named no ``notify`` address: an email, and a
  callback URL evq POSTs a signed JSON event to. ``callback_generation`` names the
  signing secret, which is derived from the server's pepper and never stored.
- ``callback_deliveries``: one row per event owed to a key's callback URL, written with
  the event (so the POST is durable before it is tried), retried with backoff until
  delivered or given up; nothing secret in it (the URL stays on the key).
- ``key_events``: an append-only feed per key of every rejection, ``unknown`` and
  operator verdict on the steps it enqueued; its id is the feed's cursor. A trigger on
  evidence writes it, so no path that closes a step (record, late answer, rescue,
  reconciler, verdict) can leave its event out, whatever notices are configured.
- ``evq_grant_runtime`` names the new table (SELECT, INSERT: append-only).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015_key_events"
down_revision: str | Sequence[str] | None = "0014_enqueue_refusals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = postgresql.TIMESTAMP(timezone=True)

_MARKER = "WHEN 'prune_log' THEN 'SELECT'"
_EVENTS_LINE = "WHEN 'key_events' THEN 'SELECT, INSERT'  -- append-only\n            "

# One event per evidence row that moves an agent's step to rejected or unknown, or
# records an operator's verdict. Notices are evq's own steps, not an agent's: left out.
# The row is the one the same statement wrote, so the step and its decision exist.
# A key with a callback URL is owed a delivery of the event, in the same transaction.
EVENT_FUNCTION = """
CREATE FUNCTION evq_key_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH ev AS (
        INSERT INTO key_events (key_id, kind, step, run_id, step_id, status, reason, detail, actor, evidence_id,
                                created_at)
        SELECT d.actor_key_id,
               CASE WHEN NEW.kind = 'operator_resolved' THEN 'verdict' ELSE NEW.to_status END,
               s.id, s.run_id, s.step_id, NEW.to_status, NEW.reason,
               left(coalesce(NEW.detail ->> 'message', NEW.detail ->> 'note'), 1000), NEW.actor, NEW.id,
               NEW.created_at
        FROM email_steps s
        JOIN decisions d ON d.id = s.decision_id
        WHERE s.id = NEW.step_id AND s.notice_of IS NULL
        RETURNING id, key_id, created_at
    )
    INSERT INTO callback_deliveries (event_id, key_id, next_attempt_at, created_at, updated_at)
    SELECT ev.id, ev.key_id, ev.created_at, ev.created_at, ev.created_at
    FROM ev JOIN api_keys k ON k.key_id = ev.key_id
    WHERE k.notify_url IS NOT NULL;
    RETURN NULL;
END
$$
"""
EVENT_TRIGGER = (
    "CREATE TRIGGER evidence_key_events AFTER INSERT ON evidence FOR EACH ROW "
    "WHEN ((NEW.to_status IN ('rejected', 'unknown') AND NEW.from_status IS DISTINCT FROM NEW.to_status) "
    "OR NEW.kind = 'operator_resolved') EXECUTE FUNCTION evq_key_event()"
)


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def upgrade() -> None:
    op.add_column("decisions", sa.Column("actor", sa.Text(), nullable=True))
    op.add_column("decisions", sa.Column("actor_key_id", sa.Text(), nullable=True))
    op.add_column("decisions", sa.Column("interface", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("notify_email", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("notify_url", sa.Text(), nullable=True))
    op.add_column("api_keys", sa.Column("callback_generation", sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "key_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("key_id", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("step_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("evidence_id", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("kind IN ('rejected', 'unknown', 'verdict')", name=op.f("ck_key_events_kind")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_key_events")),
    )
    op.create_index(op.f("ix_key_events_key_id_id"), "key_events", ["key_id", "id"], unique=False)
    op.create_table(
        "callback_deliveries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_attempt_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("delivered_at", TZ, nullable=True),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("status IN ('pending', 'delivered', 'failed')", name=op.f("ck_callback_deliveries_status")),
        sa.CheckConstraint(
            "(status = 'delivered') = (delivered_at IS NOT NULL)",
            name=op.f("ck_callback_deliveries_delivered_iff_delivered_at"),
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_callback_deliveries_attempts_nonnegative")),
        sa.ForeignKeyConstraint(
            ["event_id"], ["key_events.id"], name=op.f("fk_callback_deliveries_event_id_key_events")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_callback_deliveries")),
        sa.UniqueConstraint("event_id", name=op.f("uq_callback_deliveries_event_id")),
    )
    op.create_index(
        "ix_callback_deliveries_due",
        "callback_deliveries",
        ["next_attempt_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.execute(EVENT_FUNCTION)
    op.execute(EVENT_TRIGGER)
    op.execute(
        "CREATE TRIGGER key_events_append_only BEFORE UPDATE OR DELETE ON key_events "
        "FOR EACH ROW EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER key_events_no_truncate BEFORE TRUNCATE ON key_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )
    definition = _grant_function()
    if "'key_events'" not in definition:
        if _MARKER not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _EVENTS_LINE + _MARKER, 1))


def downgrade() -> None:
    op.execute(_grant_function().replace(_EVENTS_LINE, "", 1))
    op.execute("DROP TRIGGER IF EXISTS evidence_key_events ON evidence")
    op.execute("DROP FUNCTION IF EXISTS evq_key_event()")
    op.execute("DROP TRIGGER IF EXISTS key_events_append_only ON key_events")
    op.execute("DROP TRIGGER IF EXISTS key_events_no_truncate ON key_events")
    op.drop_index("ix_callback_deliveries_due", table_name="callback_deliveries")
    op.drop_table("callback_deliveries")
    op.drop_index(op.f("ix_key_events_key_id_id"), table_name="key_events")
    op.drop_table("key_events")
    op.drop_column("api_keys", "callback_generation")
    op.drop_column("api_keys", "notify_url")
    op.drop_column("api_keys", "notify_email")
    op.drop_column("decisions", "interface")
    op.drop_column("decisions", "actor_key_id")
    op.drop_column("decisions", "actor")
