"""Content retention: a closed step's body is kept only as long as EVQ_KEEP_CONTENT says (issue 15).

Revision ID: 0013_content_retention
Revises: 0012_step_guard
Create Date: 2026-12-01

A message body is what an agent wrote to a person: evq needs it while the send may
still happen (a retry, an operator's resend) and a little after, not for as long as
the proof of the send is kept. Now:

- ``evq_redact_batch(keep, limit, actor)``, a SECURITY DEFINER function owned by the
  owner (as ``evq_prune_batch`` is), replaces the body parts (``text``, ``html``) of
  closed steps (accepted, rejected) closed more than ``keep`` ago, by the database's
  clock, with ``null``, and records under ``payload.content_redacted`` each part's size
  in UTF-8 bytes and its SHA-256, computed here from the original. Headers,
  recipients, subject, Message-ID, key and ``payload_sha256`` stay as they were, so the
  original request still proves against the stored hash. Each step gets a
  ``content_redacted`` evidence row in the same statement. It can do nothing else: no
  open step, no step closed within ``keep``, no other column, a step once only;
- ``email_steps.content_redacted_at``: when that happened (NULL: the content is all
  there). Only the owner (inside the function) may set it: the trigger below refuses
  every other role a change to it, and refuses to reopen a redacted step (a dead-letter
  requeue would send a body that is no longer there);
- ``ix_email_steps_content_due``: the closed steps still holding content, by close
  time, so a housekeeping pass reads only what is due;
- ``evq_grant_runtime`` grants the runtime role EXECUTE on the function (edited in
  place, as 0010 and 0011 do).

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013_content_retention"
down_revision: str | Sequence[str] | None = "0012_step_guard"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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
)
KINDS = (*KINDS_BEFORE, "content_redacted")

_SIGNATURE = "evq_redact_batch(interval, integer, text)"
_MARKER = "    RETURN done;"
_GRANT_LINE = (
    "    -- Content retention (0013): the one way the runtime role changes a payload.\n"
    "    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_redact_batch(interval, integer, text) TO %I',\n"
    "                   schema_name, p_role);\n"
)


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _kinds(values: Sequence[str]) -> str:
    return "kind IN (" + ", ".join(f"'{v}'" for v in values) + ")"


# The body parts a payload may hold. A part that is null (an html-only message has no
# text) is recorded as null: nothing was there to keep.
PARTS = ("text", "html")


def _part(name: str) -> str:
    value = f"s.payload ->> '{name}'"
    return (
        f"'{name}', CASE WHEN {value} IS NULL THEN NULL ELSE jsonb_build_object("
        f"'bytes', octet_length(convert_to({value}, 'UTF8')), "
        f"'sha256', encode(sha256(convert_to({value}, 'UTF8')), 'hex')) END"
    )


def _redact_function(schema: str) -> str:
    path = f"pg_catalog, {_quoted(schema)}, pg_temp"
    parts = ", ".join(_part(p) for p in PARTS)
    nulls = ", ".join(f"'{p}', NULL" for p in PARTS)
    return f"""
CREATE FUNCTION evq_redact_batch(p_keep interval, p_limit integer, p_actor text)
RETURNS TABLE (redacted integer, first_step_id bigint, last_step_id bigint)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
AS $$
BEGIN
    -- The database's clock decides what is old, and only forward: a negative keep would
    -- reach steps that close in the future, i.e. open ones.
    IF p_keep IS NULL OR p_keep < interval '0' THEN
        RAISE EXCEPTION 'evq: content retention must be zero or positive, got %', p_keep
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'evq: redact batch size must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_actor IS NULL OR length(p_actor) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'evq: redact actor must be 1 to 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN QUERY
    WITH due AS (
        -- Closed steps only (accepted, rejected: closed_at is set iff terminal), closed
        -- before the cutoff, not yet redacted. SKIP LOCKED: a step another worker is
        -- redacting, or an operator is requeueing, is left for the next pass.
        SELECT s.id
        FROM email_steps s
        WHERE s.status IN ('accepted', 'rejected') AND s.content_redacted_at IS NULL
          AND s.closed_at <= now() - p_keep
        ORDER BY s.closed_at, s.id
        LIMIT p_limit
        FOR UPDATE OF s SKIP LOCKED
    ), done AS (
        UPDATE email_steps s
        SET payload = s.payload || jsonb_build_object({nulls})
                      || jsonb_build_object('content_redacted', jsonb_build_object(
                             'at', now(), 'parts', jsonb_build_object({parts}))),
            content_redacted_at = now(),
            updated_at = now()
        FROM due
        -- Re-checked on the locked row: the status cannot have changed since (the lock),
        -- but the predicate is the function's promise, so it is stated where it writes.
        WHERE s.id = due.id AND s.status IN ('accepted', 'rejected') AND s.content_redacted_at IS NULL
        RETURNING s.id, s.run_id, s.status, s.payload -> 'content_redacted' AS marker, s.payload_sha256
    ), ev AS (
        INSERT INTO evidence (step_id, run_id, kind, actor, from_status, to_status, reason, detail, created_at)
        -- No status change: from_status and to_status stay NULL, as for a notice.
        SELECT d.id, d.run_id, 'content_redacted', p_actor, NULL, NULL, 'retention',
               jsonb_build_object('message', 'message body removed by retention; sizes and SHA-256 kept',
                                  'parts', d.marker -> 'parts', 'payload_sha256', d.payload_sha256,
                                  'keep_seconds', extract(epoch FROM p_keep)),
               now()
        FROM done d
        RETURNING id
    )
    -- ev runs whether or not it is read (a data-modifying WITH always does), in this statement.
    SELECT (SELECT count(*) FROM done)::int, (SELECT min(id) FROM done), (SELECT max(id) FROM done);
END
$$
"""


# Only the owner (evq_redact_batch runs as it) may mark a step redacted, and a redacted
# step stays closed: its body is gone, so nothing may send it again.
CONTENT_GUARD = """
CREATE FUNCTION evq_content_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF NEW.content_redacted_at IS DISTINCT FROM OLD.content_redacted_at THEN
        RAISE EXCEPTION 'evq: step %: only evq_redact_batch marks content redacted', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.content_redacted_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status THEN
        RAISE EXCEPTION 'evq: step %: its content was redacted at %: it cannot be sent again', OLD.id,
            OLD.content_redacted_at
            USING ERRCODE = 'check_violation', HINT = 'enqueue the message anew as a new step';
    END IF;
    RETURN NEW;
END
$$
"""


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def upgrade() -> None:
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    op.add_column("email_steps", sa.Column("content_redacted_at", postgresql.TIMESTAMP(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_email_steps_redacted_only_when_closed"),
        "email_steps",
        "content_redacted_at IS NULL OR status IN ('accepted', 'rejected')",
    )
    op.create_index(
        "ix_email_steps_content_due",
        "email_steps",
        ["closed_at", "id"],
        unique=False,
        postgresql_where=sa.text("status IN ('accepted', 'rejected') AND content_redacted_at IS NULL"),
    )
    op.drop_constraint(op.f("ck_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(op.f("ck_evidence_kind"), "evidence", _kinds(KINDS))
    op.execute(CONTENT_GUARD)
    op.execute(
        "CREATE TRIGGER email_steps_content_guard BEFORE UPDATE ON email_steps "
        "FOR EACH ROW EXECUTE FUNCTION evq_content_guard()"
    )
    op.execute(_redact_function(schema))
    # A definer function is callable by PUBLIC unless revoked: only the runtime role's grant.
    op.execute(f"REVOKE ALL ON FUNCTION {_SIGNATURE} FROM PUBLIC")
    definition = _grant_function()
    if "evq_redact_batch" not in definition:
        if definition.count(_MARKER) != 1:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_MARKER, _GRANT_LINE + _MARKER, 1))


def downgrade() -> None:
    op.execute(_grant_function().replace(_GRANT_LINE, "", 1))
    op.execute(f"DROP FUNCTION IF EXISTS {_SIGNATURE}")
    op.execute("DROP TRIGGER IF EXISTS email_steps_content_guard ON email_steps")
    op.execute("DROP FUNCTION IF EXISTS evq_content_guard()")
    # Evidence of a redaction stays (append-only): the old constraint could not hold it.
    op.drop_constraint(op.f("ck_evidence_kind"), "evidence", type_="check")
    op.create_check_constraint(op.f("ck_evidence_kind"), "evidence", _kinds(KINDS))
    op.drop_index(
        "ix_email_steps_content_due",
        table_name="email_steps",
        postgresql_where=sa.text("status IN ('accepted', 'rejected') AND content_redacted_at IS NULL"),
    )
    op.drop_constraint(op.f("ck_email_steps_redacted_only_when_closed"), "email_steps", type_="check")
    op.drop_column("email_steps", "content_redacted_at")
