"""What the operators' page needs to answer at a million steps (issue 18).

Revision ID: 0019_ops_search
Revises: 0018_approvals
Create Date: 2026-12-02

- ``evq_recipient_keys(payload)``: every recipient of a request (to, cc, bcc) as the search
  box finds it: the address lower-cased, and its domain as ``@domain``. An immutable SQL
  function (pg_catalog names only, so a restore with an empty search_path builds the same
  index), indexed by GIN: "did this customer get our email?" reads the index, not every
  request. It is an expression over ``payload``, which never changes after enqueue (but for an
  approver's correction, which keeps the recipients), so the claim's and the record's updates
  stay free of it.
- ``ix_email_steps_provider_message_id``: the provider's message id (found in a bounce, a
  provider's dashboard) leads to its step. Partial: most rows have none until accepted.
- ``ix_decisions_actor``: the API key name that enqueued a step (``decisions.actor``).
- ``ix_evidence_created_at_brin``: the overview's charts read the last hours of evidence by
  time. evidence is append-only and written in time order, so a BRIN index (a few pages per
  million rows, next to nothing per insert) narrows the read to the recent blocks.
  ``autosummarize``: a block range is summarised as soon as it fills (autovacuum's work item),
  not only at the next VACUUM; an unsummarised range is read whatever the window, and on a
  table taking millions of rows between vacuums that would be most of the recent evidence.
- ``queue_samples``: the queue's figures once a minute (how many rows wait, how long the
  oldest claimable one has waited, unknown and held counts and the oldest unknown's age), one
  row per minute whoever writes it first. The queue's current state says nothing of an hour
  ago; these rows are what "is it getting better or worse?" is drawn from. Queue state, not
  history (the runtime role may delete old samples), kept for days, not forever.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019_ops_search"
down_revision: str | Sequence[str] | None = "0018_approvals"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RECIPIENT_KEYS = """
CREATE FUNCTION evq_recipient_keys(payload jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $$
    SELECT coalesce(pg_catalog.array_agg(DISTINCT k), '{}'::text[])
    FROM (
        SELECT pg_catalog.lower(r.value OPERATOR(pg_catalog.->>) 'email') AS e
        FROM pg_catalog.jsonb_array_elements(
            pg_catalog.jsonb_build_array()
            OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'to', '[]'::jsonb)
            OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'cc', '[]'::jsonb)
            OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'bcc', '[]'::jsonb)
        ) AS r
        WHERE pg_catalog.jsonb_typeof(r.value) = 'object'
    ) AS a
    CROSS JOIN LATERAL (VALUES (a.e), ('@' OPERATOR(pg_catalog.||) pg_catalog.split_part(a.e, '@', 2))) AS x(k)
    WHERE a.e IS NOT NULL AND a.e OPERATOR(pg_catalog.<>) ''
$$
"""


def upgrade() -> None:
    op.execute(RECIPIENT_KEYS)
    op.execute("CREATE INDEX ix_email_steps_recipient_keys ON email_steps USING gin (evq_recipient_keys(payload))")
    op.create_index(
        "ix_email_steps_provider_message_id",
        "email_steps",
        ["provider_message_id"],
        postgresql_where=sa.text("provider_message_id IS NOT NULL"),
    )
    op.create_index("ix_decisions_actor", "decisions", ["actor"], postgresql_where=sa.text("actor IS NOT NULL"))
    op.execute("CREATE INDEX ix_evidence_created_at_brin ON evidence USING brin (created_at) WITH (autosummarize = on)")
    op.create_table(
        "queue_samples",
        sa.Column("at", sa.DateTime(timezone=True), primary_key=True),  # the minute, truncated
        sa.Column("pending", sa.Integer, nullable=False),
        sa.Column("claimable", sa.Integer, nullable=False),
        sa.Column("lag_seconds", sa.Float, nullable=False),  # the oldest claimable row's wait
        sa.Column("in_flight", sa.Integer, nullable=False),
        sa.Column("retryable", sa.Integer, nullable=False),
        sa.Column("unknown", sa.Integer, nullable=False),
        sa.Column("unknown_oldest_seconds", sa.Float, nullable=True),
        sa.Column("held", sa.Integer, nullable=False),
        sa.Column("sampled_by", sa.Text, nullable=False),
        sa.CheckConstraint("at = date_trunc('minute', at)", name="ck_queue_samples_at_minute"),
    )


def downgrade() -> None:
    op.drop_table("queue_samples")
    op.execute("DROP INDEX IF EXISTS ix_evidence_created_at_brin")
    op.drop_index("ix_decisions_actor", table_name="decisions")
    op.drop_index("ix_email_steps_provider_message_id", table_name="email_steps")
    op.execute("DROP INDEX IF EXISTS ix_email_steps_recipient_keys")
    op.execute("DROP FUNCTION IF EXISTS evq_recipient_keys(jsonb)")
