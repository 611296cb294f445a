"""Provider circuits: an outage is not a refusal (issue 12, invariant 10).

Revision ID: 0011_provider_circuits
Revises: 0009_runtime_role
Create Date: 2026-12-01

- ``provider_circuits``: one row per provider whose circuit has ever opened (no row:
  closed). Every worker's claim skips the steps of a provider whose circuit is not
  closed; one worker at a time takes the probe (``half_open``). Operational state,
  rewritten on each change.
- ``provider_circuit_events``: every change of a circuit (who, when, why), append-only
  like evidence (the same trigger), so "why did nothing go out between 14:02 and 14:09"
  has an answer after the circuit has closed again.
- ``email_steps.uncharged_attempts``: attempts that hit a provider-level fault and are
  not counted against the message; ``email_steps.retry_from``: when the retry budget
  (EVQ_RETRY_FOR) started counting, NULL for the enqueue (an operator's requeue of a
  step rejected after temporary failures sets it).
- ``evq_grant_runtime`` names the new history table, so the runtime role may only
  SELECT and INSERT there (the function grants everything it does not name as queue
  state).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011_provider_circuits"
down_revision: str | Sequence[str] | None = "0010_key_hmac"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# evq_grant_runtime (0009) grants by table name, and every table it does not name gets
# the privileges of queue state: the new history table must be named. The function is
# edited in place (its own text, read back from the catalogue) rather than copied here,
# so another revision's edits to it are kept.
_MARKER = "WHEN 'prune_log' THEN 'SELECT'"
_EVENTS_LINE = "WHEN 'provider_circuit_events' THEN 'SELECT, INSERT'  -- append-only\n            "

TZ = postgresql.TIMESTAMP(timezone=True)


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def upgrade() -> None:
    op.add_column("email_steps", sa.Column("uncharged_attempts", sa.Integer(), server_default="0", nullable=False))
    op.add_column("email_steps", sa.Column("retry_from", TZ, nullable=True))
    op.create_check_constraint(
        op.f("ck_email_steps_uncharged_within_attempts"),
        "email_steps",
        "uncharged_attempts >= 0 AND uncharged_attempts <= attempts",
    )
    op.create_table(
        "provider_circuits",
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("opened_at", TZ, nullable=True),
        sa.Column("probe_at", TZ, nullable=True),
        sa.Column("probes", sa.Integer(), server_default="0", nullable=False),
        sa.Column("probe_owner", sa.Text(), nullable=True),
        sa.Column("probe_expires_at", TZ, nullable=True),
        sa.Column("updated_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("state IN ('closed', 'half_open', 'open')", name=op.f("ck_provider_circuits_state")),
        sa.CheckConstraint(
            "(state = 'closed') = (opened_at IS NULL)", name=op.f("ck_provider_circuits_opened_iff_not_closed")
        ),
        sa.CheckConstraint(
            "(state = 'open') = (probe_at IS NOT NULL)", name=op.f("ck_provider_circuits_probe_at_iff_open")
        ),
        sa.CheckConstraint(
            "(state = 'half_open') = (probe_owner IS NOT NULL AND probe_expires_at IS NOT NULL)",
            name=op.f("ck_provider_circuits_probe_held_iff_half_open"),
        ),
        sa.CheckConstraint("probes >= 0", name=op.f("ck_provider_circuits_probes_nonnegative")),
        sa.PrimaryKeyConstraint("provider", name=op.f("pk_provider_circuits")),
    )
    op.create_table(
        "provider_circuit_events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("from_state", sa.Text(), nullable=False),
        sa.Column("to_state", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("probe_in", sa.Float(), nullable=True),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "from_state IN ('closed', 'half_open', 'open')", name=op.f("ck_provider_circuit_events_from_state")
        ),
        sa.CheckConstraint(
            "to_state IN ('closed', 'half_open', 'open')", name=op.f("ck_provider_circuit_events_to_state")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_provider_circuit_events")),
    )
    op.create_index(
        op.f("ix_provider_circuit_events_provider_id"), "provider_circuit_events", ["provider", "id"], unique=False
    )
    op.execute(
        "CREATE TRIGGER provider_circuit_events_append_only BEFORE UPDATE OR DELETE ON provider_circuit_events "
        "FOR EACH ROW EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER provider_circuit_events_no_truncate BEFORE TRUNCATE ON provider_circuit_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )
    definition = _grant_function()
    if "'provider_circuit_events'" not in definition:
        if _MARKER not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _EVENTS_LINE + _MARKER, 1))


def downgrade() -> None:
    op.execute(_grant_function().replace(_EVENTS_LINE, "", 1))
    op.execute("DROP TRIGGER IF EXISTS provider_circuit_events_append_only ON provider_circuit_events")
    op.execute("DROP TRIGGER IF EXISTS provider_circuit_events_no_truncate ON provider_circuit_events")
    op.drop_index(op.f("ix_provider_circuit_events_provider_id"), table_name="provider_circuit_events")
    op.drop_table("provider_circuit_events")
    op.drop_table("provider_circuits")
    op.drop_constraint(op.f("ck_email_steps_uncharged_within_attempts"), "email_steps", type_="check")
    op.drop_column("email_steps", "retry_from")
    op.drop_column("email_steps", "uncharged_attempts")
