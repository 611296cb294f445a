"""A step's request is fixed at enqueue, and a closed step stays closed.

Revision ID: 0012_step_guard
Revises: 0011_provider_circuits
Create Date: 2026-12-01

The runtime role must UPDATE ``email_steps`` (every transition is an UPDATE), so the
table's privileges cannot keep it from rewriting what a step *is*: before this
revision it could replace an accepted step's payload, Message-ID or idempotency key
(what the evidence says was sent would no longer be what the row holds), or put an
accepted step back to ``pending`` so that workers would send it again. A trigger
now refuses, for every role that cannot act as the table's owner (the owner could
disable the trigger anyway, and tests and repairs run as it, as with the prune switch):

- any change to the columns fixed at enqueue (``id``, ``run_id``, ``step_id``,
  ``decision_id``, ``idempotency_key``, ``message_id``, ``provider``, ``payload``,
  ``payload_sha256``, ``notify``, ``created_at``). No evq statement updates them;
- moving an ``accepted`` step to any other status;
- moving a ``rejected`` step to any other status, except the operator's dead-letter
  requeue (to ``retryable``, only for ``attempts_exhausted`` /
  ``retry_budget_exhausted``: temporary failures, nothing possibly delivered).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012_step_guard"
down_revision: str | Sequence[str] | None = "0011_provider_circuits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FIXED = (
    "id",
    "run_id",
    "step_id",
    "decision_id",
    "idempotency_key",
    "message_id",
    "provider",
    "payload",
    "payload_sha256",
    "notify",
    "created_at",
)

GUARD = """
CREATE FUNCTION evq_step_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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


def upgrade() -> None:
    changed = " OR ".join(f"NEW.{c} IS DISTINCT FROM OLD.{c}" for c in FIXED)
    op.execute(GUARD.format(changed=changed))
    op.execute(
        "CREATE TRIGGER email_steps_guard BEFORE UPDATE ON email_steps FOR EACH ROW EXECUTE FUNCTION evq_step_guard()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS email_steps_guard ON email_steps")
    op.execute("DROP FUNCTION IF EXISTS evq_step_guard()")
