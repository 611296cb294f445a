"""The key ledger: a key once used never produces a second send, not even after prune (issue 29).

Revision ID: 0026_step_keys
Revises: 0025_partition_drop_lock
Create Date: 2026-12-04

``evq prune`` deleted a closed step and with it the only record of its idempotency key: an
agent retrying the same request afterwards (a slow retry loop, a restored checkpoint, a
replayed job) got a new step, and the recipient the message twice. Invariant 12: what answers
a repeat outlives prune.

- ``step_keys``: one row per key ever used, written by the enqueue statement before its step
  and in the same statement (step_enqueue, step_enqueue_many, notice_enqueue in queries.sql),
  insert-once: the key, the step's id, run and step ids, Message-ID, provider, the digest of
  the request the agent sent, and when. ``evq_prune_batch`` writes the step's end into it
  (status, reason, maybe_delivered, the digest an approver corrected it to, closed_at,
  pruned_at) in the statement that deletes the step. Kept for ever: nothing deletes it (a
  trigger refuses DELETE and TRUNCATE, even to the owner), and nothing rewrites what an
  enqueue wrote or what a prune recorded.
- The race is closed by construction: the ledger's primary key is where every enqueue of a key
  meets every other and the prune. A key's row exists from its first enqueue's commit, so an
  enqueue racing the prune of that key is answered by the step its snapshot still shows, or meets
  the row (waiting for the prune's transaction if it holds it), and writes no step; the prune's
  write is an upsert on the same key, so a step with
  no ledger row (written before this revision by a process still running the old code, or by
  hand) is recorded when it goes.
- Existing steps are copied in (their keys, as the enqueue writes them). Keys whose steps were
  pruned before this revision are gone with them: nothing is left to copy them from.
- ``evq_grant_runtime`` gives the runtime role SELECT and INSERT of the enqueue's columns only:
  no UPDATE, no DELETE, and no final status it could write itself.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0026_step_keys"
down_revision: str | Sequence[str] | None = "0025_partition_drop_lock"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = postgresql.TIMESTAMP(timezone=True)

# What an enqueue writes: the columns the runtime role may insert.
ENQUEUED = ("idempotency_key", "id", "run_id", "step_id", "message_id", "provider", "payload_sha256", "created_at")
# What only a prune writes (through the owner's evq_prune_batch).
ENDED = ("status", "reason", "maybe_delivered", "corrected_sha256", "closed_at", "pruned_at")

PRUNE = "evq_prune_batch(timestamptz, integer, text, uuid, integer)"
_DELETED_0009 = "        RETURNING s.id, s.decision_id\n    ), dec AS (\n"
_DELETED = """        RETURNING s.id, s.decision_id, s.idempotency_key, s.run_id, s.step_id, s.message_id, s.provider,
                  s.payload_sha256, s.requested_sha256, s.created_at, s.status, s.reason, s.maybe_delivered,
                  s.closed_at
    ), kept AS (
        -- The key ledger keeps what answers a repeat of each key (0026, invariant 12), written
        -- in this statement: never a moment with the step gone and its end unrecorded. An upsert
        -- on the key, the point every enqueue of it meets: a step with no ledger row yet is
        -- recorded now. The ledger holds the agent's own digest; an approver's correction goes
        -- in corrected_sha256.
        INSERT INTO step_keys AS k (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256,
                                    created_at, status, reason, maybe_delivered, corrected_sha256, closed_at,
                                    pruned_at)
        SELECT st.idempotency_key, st.id, st.run_id, st.step_id, st.message_id, st.provider,
               decode(coalesce(st.requested_sha256, st.payload_sha256), 'hex'), st.created_at, st.status,
               st.reason, st.maybe_delivered,
               CASE WHEN st.requested_sha256 IS NOT NULL THEN decode(st.payload_sha256, 'hex') END,
               st.closed_at, now()
        FROM st
        ON CONFLICT (idempotency_key) DO UPDATE
        SET status = EXCLUDED.status, reason = EXCLUDED.reason, maybe_delivered = EXCLUDED.maybe_delivered,
            corrected_sha256 = EXCLUDED.corrected_sha256, closed_at = EXCLUDED.closed_at,
            pruned_at = EXCLUDED.pruned_at
        WHERE k.pruned_at IS NULL
    ), dec AS (
"""

_MARKER = "WHEN 'prune_log' THEN 'SELECT'"
_LINE = (
    f"WHEN 'step_keys' THEN 'SELECT, INSERT ({', '.join(ENQUEUED)})'  -- insert-once; its end is the prune's\n"
    "            "
)

# Anything but recording a step's end once, by the prune, is refused (evq_append_only raises):
# what an enqueue wrote never changes, nor what a prune recorded.
_REWRITE = " OR ".join(["OLD.pruned_at IS NOT NULL"] + [f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in ENQUEUED])


def _definition(signature: str) -> str:
    return str(
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"), {"f": signature})
        .scalar_one()
    )


def _edit(signature: str, old: str, new: str) -> None:
    text = _definition(signature)
    if text.count(old) != 1:
        raise RuntimeError(f"{signature} does not read as this migration expects (looking for {old[:60]!r})")
    op.execute(text.replace(old, new))


def upgrade() -> None:
    op.create_table(
        "step_keys",
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("run_id", sa.Text(), nullable=False),
        sa.Column("step_id", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("payload_sha256", postgresql.BYTEA(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("status", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("maybe_delivered", sa.Boolean(), nullable=True),
        sa.Column("corrected_sha256", postgresql.BYTEA(), nullable=True),
        sa.Column("closed_at", TZ, nullable=True),
        sa.Column("pruned_at", TZ, nullable=True),
        sa.CheckConstraint("length(payload_sha256) = 32", name=op.f("ck_step_keys_payload_sha256_bytes")),
        sa.CheckConstraint(
            "corrected_sha256 IS NULL OR length(corrected_sha256) = 32",
            name=op.f("ck_step_keys_corrected_sha256_bytes"),
        ),
        sa.CheckConstraint("status IS NULL OR status IN ('accepted', 'rejected')", name=op.f("ck_step_keys_status")),
        sa.CheckConstraint(
            "(pruned_at IS NULL) = (status IS NULL) AND (pruned_at IS NULL) = (closed_at IS NULL)",
            name=op.f("ck_step_keys_pruned_with_its_end"),
        ),
        sa.PrimaryKeyConstraint("idempotency_key", name=op.f("pk_step_keys")),
    )
    # The steps there are now, as their enqueue would have written them.
    op.execute(
        f"""
        INSERT INTO step_keys ({", ".join(ENQUEUED)})
        SELECT idempotency_key, id, run_id, step_id, message_id, provider,
               decode(coalesce(requested_sha256, payload_sha256), 'hex'), created_at
        FROM email_steps
        """
    )
    # After the copy: `evq steps show` of a pruned step's id reads it (step_pruned).
    op.create_index(op.f("ix_step_keys_id"), "step_keys", ["id"], unique=False)
    op.execute(
        "CREATE TRIGGER step_keys_kept BEFORE DELETE ON step_keys FOR EACH ROW EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER step_keys_no_truncate BEFORE TRUNCATE ON step_keys "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        f"CREATE TRIGGER step_keys_insert_once BEFORE UPDATE ON step_keys FOR EACH ROW WHEN ({_REWRITE}) "
        "EXECUTE FUNCTION evq_append_only()"
    )
    _edit(PRUNE, _DELETED_0009, _DELETED)
    definition = _definition("evq_grant_runtime(name)")
    if "'step_keys'" not in definition:
        if _MARKER not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _LINE + _MARKER, 1))


def downgrade() -> None:
    op.execute(_definition("evq_grant_runtime(name)").replace(_LINE, "", 1))
    _edit(PRUNE, _DELETED, _DELETED_0009)
    op.drop_table("step_keys")
