"""The step guards run only for an update they may refuse, and with a fixed search path; the overflow guard reads prune_log by index (issue 19).

Revision ID: 0024_guards_when
Revises: 0023_recipient_keys_plpgsql
Create Date: 2026-12-03

Every claim and every recorded answer updates its step, and each update ran both row
triggers on ``email_steps`` (0012's ``evq_step_guard``, 0013's ``evq_content_guard``): two
PL/pgSQL calls a row, each with a ``pg_has_role`` lookup, about 30 us of the server's time
per row per update (``EXPLAIN ANALYZE`` of a 100-row claim: 3.3 ms in the two triggers of
~20 ms). Neither can refuse a claim or an answer: they refuse a change to what a step is,
a hold after enqueue, leaving ``accepted`` or ``rejected``, and any change touching a
redacted step's status or its redaction mark. Each trigger now has a ``WHEN`` condition,
evaluated in C before the function is called, that is true for every update the function
could refuse (its refusals' conditions, joined by OR); for any other update the function
would have returned the row unchanged, so skipping it changes nothing. When the condition
holds, the function decides exactly as before (the owner's bypass, the approver's
correction of a held request).

``evq_evidence_overflow`` (0022) asks ``prune_log``, for each evidence row the overflow
partition takes, whether a dropped partition held that step id. ``prune_log`` has a row per
prune batch, so that read grew with every prune run; a partial index over the dropped
partitions' ranges makes it a probe of a few entries.

Four trigger functions named tables without a schema and ran on the caller's search path, on
which a session's temporary tables come first: the runtime role could create a temporary
``pg_class`` saying it owns ``email_steps`` and so skip both guards (reopen an accepted step,
rewrite a request), or a temporary ``key_events`` to swallow its session's events. They now
run with the path evq's other functions have (0022): pg_catalog, evq's schema, pg_temp last.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0024_guards_when"
down_revision: str | Sequence[str] | None = "0023_recipient_keys_plpgsql"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# What a step is, fixed at enqueue (0012), and the request an approver may correct (0018):
# a change to any of them is for the function to judge.
_FIXED = (
    "id",
    "run_id",
    "step_id",
    "decision_id",
    "idempotency_key",
    "message_id",
    "provider",
    "notify",
    "created_at",
    "payload",
    "payload_sha256",
    "requested_sha256",
)


def _row(alias: str) -> str:
    return "(" + ", ".join(f"{alias}.{c}" for c in _FIXED) + ")"


STEP_GUARD_WHEN = (
    f"{_row('OLD')} IS DISTINCT FROM {_row('NEW')}"
    " OR (NEW.status = 'held' AND OLD.status <> 'held')"
    " OR (OLD.status IN ('accepted', 'rejected') AND NEW.status <> OLD.status)"
)
CONTENT_GUARD_WHEN = (
    "NEW.content_redacted_at IS DISTINCT FROM OLD.content_redacted_at"
    " OR (OLD.content_redacted_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status)"
)


def _triggers(step_when: str | None, content_when: str | None) -> None:
    for name, function, when in (
        ("email_steps_guard", "evq_step_guard", step_when),
        ("email_steps_content_guard", "evq_content_guard", content_when),
    ):
        op.execute(f"DROP TRIGGER {name} ON email_steps")
        condition = f" WHEN ({when})" if when else ""
        op.execute(
            f"CREATE TRIGGER {name} BEFORE UPDATE ON email_steps FOR EACH ROW{condition} EXECUTE FUNCTION {function}()"
        )


# Trigger functions that name tables without a schema and had no fixed search path
# (evq_append_only, 0001 and since; the guards, 0012 and 0013; evq_key_event, 0015): a
# session's temporary tables are searched before pg_catalog and the schema unless the path
# names pg_temp, so the runtime role (which may create temporary tables) could shadow them.
# Each gets the path evq's other functions have (0022): the catalog, evq's schema, pg_temp
# last. Called only for the rare rows their WHEN conditions let through, the setting costs
# nothing on the hot path. A later CREATE OR REPLACE of any of them must say SET search_path
# itself: it replaces the function's settings with its own, none if it names none
# (tests/faults/test_step_guard_calls.py's temporary-table tests then fail).
_PINNED = ("evq_step_guard()", "evq_content_guard()", "evq_key_event()", "evq_append_only()")


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def upgrade() -> None:
    _triggers(STEP_GUARD_WHEN, CONTENT_GUARD_WHEN)
    schema = op.get_bind().exec_driver_sql("SELECT current_schema()").scalar_one()
    for function in _PINNED:
        op.execute(f"ALTER FUNCTION {function} SET search_path = pg_catalog, {_quoted(str(schema))}, pg_temp")
    op.create_index(
        "ix_prune_log_dropped_ranges",
        "prune_log",
        ["first_step_id", "last_step_id"],
        postgresql_where="evidence_partition IS NOT NULL",
    )


def downgrade() -> None:
    op.drop_index("ix_prune_log_dropped_ranges", table_name="prune_log")
    for function in _PINNED:
        op.execute(f"ALTER FUNCTION {function} RESET search_path")
    _triggers(None, None)
