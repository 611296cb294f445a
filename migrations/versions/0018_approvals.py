"""Approval gates, blast-radius budgets, scheduling and priority (issue 17).

Revision ID: 0018_approvals
Revises: 0017_delivery_events
Create Date: 2026-12-01

- status ``held``: a send the approval policy (worker/approval.py) stopped at enqueue. It is
  before ``pending``: nothing claims it (the claim reads only pending and retryable rows). A
  person approves it (``pending``, same key and Message-ID) or denies it (``rejected``,
  reason ``denied``); it expires (``rejected``, reason ``approval_expired``). ``held_since``
  is set exactly while a step is held (like ``unknown_since``); ``hold_expires_at`` is when it
  expires (NULL: never); ``hold`` is why it was held (the rules and budgets that stopped it),
  kept after the decision.
- ``requested_sha256``: the payload hash the agent asked for, set only when an approver
  corrected the message (``payload`` and ``payload_sha256`` are then what is sent, and the
  ``approved`` evidence shows both hashes). A retry of the agent's own request still finds its step.
- ``send_at``: the time the agent asked the send to go out no earlier than (``next_attempt_at``
  starts there); ``priority``: claimed before lower priorities (``high`` 1, ``normal`` 0,
  ``low`` -1). The claim's index leads with it.
- evidence kinds ``held``, ``approved``, ``denied``, ``cancelled``, ``hold_expired``.
- ``send_budgets``: the blast-radius counters, one row per (budget, scope, window), incremented
  under the row's lock in the enqueue's transaction, so concurrent enqueues cannot overshoot a cap.
- ``known_recipients``: who each sender has been allowed to mail (an address, or ``@domain``),
  the first-contact rule's memory.
- the step guard (0012) lets the runtime role change a step's payload only as a held step
  is approved (held -> pending) with ``requested_sha256`` keeping the agent's hash, and never
  put a step back to ``held``.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018_approvals"
down_revision: str | Sequence[str] | None = "0017_delivery_events"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = postgresql.TIMESTAMP(timezone=True)

STATUSES_BEFORE = ("pending", "in_flight", "retryable", "unknown", "accepted", "rejected")
STATUSES = ("held", *STATUSES_BEFORE)
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
    "delivery_event",
)
KINDS = (*KINDS_BEFORE, "held", "approved", "denied", "cancelled", "hold_expired")

# What 0012 fixed at enqueue, but the payload and its hash: an approval may correct those.
FIXED = (
    "id",
    "run_id",
    "step_id",
    "decision_id",
    "idempotency_key",
    "message_id",
    "provider",
    "notify",
    "created_at",
)

GUARD = """
CREATE OR REPLACE FUNCTION evq_step_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF {changed} THEN
        RAISE EXCEPTION 'evq: step %: what a step is (its request, ids and key) is fixed at enqueue', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    -- An approver's correction: only as the held step is approved, with the agent's own hash kept.
    IF (NEW.payload IS DISTINCT FROM OLD.payload OR NEW.payload_sha256 IS DISTINCT FROM OLD.payload_sha256
        OR NEW.requested_sha256 IS DISTINCT FROM OLD.requested_sha256)
       AND NOT (OLD.status = 'held' AND NEW.status = 'pending'
                AND NEW.requested_sha256 IS NOT DISTINCT FROM coalesce(OLD.requested_sha256, OLD.payload_sha256)) THEN
        RAISE EXCEPTION 'evq: step %: a request is corrected only as its held send is approved', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = 'held' AND OLD.status <> 'held' THEN
        RAISE EXCEPTION 'evq: step %: a send is held only at enqueue', OLD.id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'accepted' AND NEW.status <> 'accepted' THEN
        RAISE EXCEPTION 'evq: step % was accepted by its provider: it cannot become % again', OLD.id, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'rejected' AND NEW.status <> 'rejected'
       AND NOT (NEW.status = 'retryable' AND OLD.reason IN ('attempts_exhausted', 'retry_budget_exhausted')) THEN
        RAISE EXCEPTION 'evq: step % was rejected (%): only a dead-letter requeue may reopen it', OLD.id, OLD.reason
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$
"""

GUARD_0012_FIXED = (*FIXED[:7], "payload", "payload_sha256", *FIXED[7:])
GUARD_0012 = """
CREATE OR REPLACE FUNCTION evq_step_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF {changed} THEN
        RAISE EXCEPTION 'evq: step %: what a step is (its request, ids and key) is fixed at enqueue', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'accepted' AND NEW.status <> 'accepted' THEN
        RAISE EXCEPTION 'evq: step % was accepted by its provider: it cannot become % again', OLD.id, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'rejected' AND NEW.status <> 'rejected'
       AND NOT (NEW.status = 'retryable' AND OLD.reason IN ('attempts_exhausted', 'retry_budget_exhausted')) THEN
        RAISE EXCEPTION 'evq: step % was rejected (%): only a dead-letter requeue may reopen it', OLD.id, OLD.reason
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$
"""


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def _changed(columns: Sequence[str]) -> str:
    return " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in columns)


def upgrade() -> None:
    op.add_column("email_steps", sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False))
    op.add_column("email_steps", sa.Column("send_at", TZ, nullable=True))
    op.add_column("email_steps", sa.Column("held_since", TZ, nullable=True))
    op.add_column("email_steps", sa.Column("hold_expires_at", TZ, nullable=True))
    op.add_column("email_steps", sa.Column("hold", postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column("email_steps", sa.Column("requested_sha256", sa.Text(), nullable=True))
    op.drop_constraint(op.f("ck_email_steps_status"), "email_steps", type_="check")
    op.create_check_constraint(op.f("ck_email_steps_status"), "email_steps", _in("status", STATUSES))
    op.create_check_constraint(
        op.f("ck_email_steps_held_since_iff_held"), "email_steps", "(status = 'held') = (held_since IS NOT NULL)"
    )
    op.create_check_constraint(
        op.f("ck_email_steps_hold_expiry_only_when_held"),
        "email_steps",
        "hold_expires_at IS NULL OR status = 'held'",
    )
    op.create_check_constraint(op.f("ck_email_steps_priority_range"), "email_steps", "priority BETWEEN -1 AND 1")
    op.create_check_constraint(
        op.f("ck_email_steps_requested_sha256_hex"),
        "email_steps",
        "requested_sha256 IS NULL OR requested_sha256 ~ '^[0-9a-f]{64}$'",
    )
    op.drop_index("ix_email_steps_claimable", table_name="email_steps")
    op.execute(
        "CREATE INDEX ix_email_steps_claimable ON email_steps (priority DESC, next_attempt_at, id) "
        "WHERE status IN ('pending', 'retryable')"
    )
    op.create_index(
        "ix_email_steps_held",
        "email_steps",
        ["held_since", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'held'"),
    )
    op.drop_constraint(op.f("ck_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(op.f("ck_evidence_kind"), "evidence", _in("kind", KINDS))
    # Evidence of the held lifecycle moves a step from or to held.
    for column in ("from_status", "to_status"):
        op.drop_constraint(op.f(f"ck_evidence_{column}"), "evidence", type_="check")
        op.create_check_constraint(
            op.f(f"ck_evidence_{column}"), "evidence", f"{column} IS NULL OR {_in(column, STATUSES)}"
        )
    op.create_table(
        "send_budgets",
        sa.Column("budget", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("window_start", TZ, nullable=False),
        sa.Column("used", sa.Integer(), server_default="0", nullable=False),
        sa.Column("updated_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("used >= 0", name=op.f("ck_send_budgets_used_nonnegative")),
        sa.PrimaryKeyConstraint("budget", "scope", "window_start", name=op.f("pk_send_budgets")),
    )
    op.create_table(
        "known_recipients",
        sa.Column("sender", sa.Text(), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=False),
        sa.Column("first_step_id", sa.BigInteger(), nullable=True),
        sa.Column("created_at", TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("sender", "recipient", name=op.f("pk_known_recipients")),
    )
    op.execute(GUARD.format(changed=_changed(FIXED)))


def downgrade() -> None:
    op.execute(GUARD_0012.format(changed=_changed(GUARD_0012_FIXED)))
    op.drop_table("known_recipients")
    op.drop_table("send_budgets")
    # Evidence of approvals stays (append-only): the old constraint could not hold it.
    op.drop_constraint(op.f("ck_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(op.f("ck_evidence_kind"), "evidence", _in("kind", KINDS))
    op.drop_index("ix_email_steps_held", table_name="email_steps", postgresql_where=sa.text("status = 'held'"))
    op.drop_index("ix_email_steps_claimable", table_name="email_steps")
    op.create_index(
        "ix_email_steps_claimable",
        "email_steps",
        ["next_attempt_at", "id"],
        unique=False,
        postgresql_where=sa.text("status IN ('pending', 'retryable')"),
    )
    for name in ("requested_sha256_hex", "priority_range", "hold_expiry_only_when_held", "held_since_iff_held"):
        op.drop_constraint(op.f(f"ck_email_steps_{name}"), "email_steps", type_="check")
    # A held step cannot be kept by the old status list: the downgrade refuses while one exists.
    op.drop_constraint(op.f("ck_email_steps_status"), "email_steps", type_="check")
    op.create_check_constraint(op.f("ck_email_steps_status"), "email_steps", _in("status", STATUSES_BEFORE))
    for column in ("requested_sha256", "hold", "hold_expires_at", "held_since", "send_at", "priority"):
        op.drop_column("email_steps", column)
