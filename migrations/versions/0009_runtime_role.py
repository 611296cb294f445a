"""History that the application's own role cannot rewrite: an owner role and a runtime role.

Revision ID: 0009_runtime_role
Revises: 0007_rate_limits
Create Date: 2026-12-01

Before this revision the append-only trigger was the only guard, and it held only
against bugs: the role that ran the migrations owned the tables, so it could
DISABLE TRIGGER, replace evq_append_only() or DROP TABLE evidence, and the prune
switch (``evq.pruning``) was a setting any session could turn on. Now:

- the role that runs ``evq db upgrade`` owns everything; workers, ``evq serve`` and
  ``evq mcp`` connect as a runtime role that ``evq_grant_runtime(role)`` grants
  exactly what they need (``evq db upgrade --runtime-role NAME`` calls it, and every
  later upgrade calls it again, so a table a later revision adds is covered):
  no ownership, no DDL, no DELETE of steps, no UPDATE or DELETE of evidence,
  decisions or prune_log;
- removing history goes through ``evq_prune_batch``, a SECURITY DEFINER function
  owned by the owner with a fixed search_path. It turns the prune switch on for its
  own statement only, and the trigger honours the switch only when
  the current user is the table's owner (inside the function, it is), so a runtime
  session that sets the switch itself gains nothing;
- the prune batch never deletes a step a failure notice still points at: an original
  waits until each of its notices may go too, and goes in the same batch as them
  (the foreign key email_steps.notice_of refused the delete before); the dry run
  counts through the same predicate (``evq_prune_count``);
- the cutoff is checked against the database's clock: a cutoff in the future (a
  client whose clock runs ahead) is refused.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_runtime_role"
down_revision: str | Sequence[str] | None = "0007_rate_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


APPEND_ONLY_OWNER_ONLY = """
CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The one exception (evq prune): a DELETE of evidence or decisions while the
    -- prune switch is on AND the current user is the table's owner (the switch is
    -- a setting any session can set; only evq_prune_batch, which runs as the owner,
    -- is trusted with it). Evidence only when its step is terminal.
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' AND TG_TABLE_NAME IN ('evidence', 'decisions')
       AND coalesce(current_setting('evq.pruning', true), '') = 'on'
       AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        IF TG_TABLE_NAME = 'decisions' THEN
            RETURN OLD;  -- the foreign key keeps every decision a step still points at
        END IF;
        IF EXISTS (SELECT 1 FROM email_steps s WHERE s.id = OLD.step_id AND s.status IN ('accepted', 'rejected')) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'evidence is never changed; append a new row instead (evq prune is the only way to remove old rows)';
END
$$
"""

APPEND_ONLY_0004 = """
CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' AND TG_TABLE_NAME IN ('evidence', 'decisions')
       AND coalesce(current_setting('evq.pruning', true), '') = 'on' THEN
        IF TG_TABLE_NAME = 'decisions' THEN
            RETURN OLD;
        END IF;
        IF EXISTS (SELECT 1 FROM email_steps s WHERE s.id = OLD.step_id AND s.status IN ('accepted', 'rejected')) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'evidence is never changed; append a new row instead (evq prune is the only way to remove old rows)';
END
$$
"""

# Which steps a prune with this cutoff removes. A step may go when it is terminal and
# was created and closed before the cutoff, and every failure notice that points at
# it (notice_of) may go too; a notice goes with its original when the original may go
# (same batch), alone when the original stays. A notice never has a notice of its own
# (ck_email_steps_notice_never_notifies), so one level is the whole story.
# evq_prune_count and evq_prune_batch both use this text, so the dry run counts
# exactly what the real run deletes.
ELIGIBLE = """
    {s}.status IN ('accepted', 'rejected') AND {s}.created_at < {cutoff} AND {s}.closed_at < {cutoff}
    AND NOT EXISTS (
        SELECT 1 FROM email_steps n
        WHERE n.notice_of = {s}.id
          AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < {cutoff} AND n.closed_at < {cutoff})
    )
"""


def _eligible(alias: str, cutoff: str) -> str:
    return ELIGIBLE.format(s=alias, cutoff=cutoff)


def _roots(cutoff: str) -> str:
    # A batch is counted in roots: the steps that are not a notice of an original that
    # also goes (those ride along with their original).
    return f"""
    {_eligible("s", cutoff)}
    AND NOT (s.notice_of IS NOT NULL AND EXISTS (
        SELECT 1 FROM email_steps o WHERE o.id = s.notice_of AND {_eligible("o", cutoff)}
    ))
    """


def _prune_functions(schema: str) -> list[str]:
    path = f"pg_catalog, {_quoted(schema)}, pg_temp"
    roots = _roots("p_cutoff")
    return [
        f"""
CREATE FUNCTION evq_prune_count(p_cutoff timestamptz)
RETURNS TABLE (pruned_steps bigint, pruned_evidence bigint, pruned_decisions bigint)
LANGUAGE sql STABLE SET search_path = {path} AS $$
    WITH roots AS (
        SELECT s.id, s.decision_id FROM email_steps s WHERE {roots}
    ), doomed AS (
        SELECT id, decision_id FROM roots
        UNION ALL
        SELECT n.id, n.decision_id FROM email_steps n JOIN roots r ON n.notice_of = r.id
    )
    SELECT (SELECT count(*) FROM doomed),
           (SELECT count(*) FROM evidence e JOIN doomed d ON d.id = e.step_id),
           (SELECT count(DISTINCT decision_id) FROM doomed)
$$
""",
        f"""
CREATE FUNCTION evq_prune_batch(p_cutoff timestamptz, p_limit integer, p_actor text, p_run uuid, p_batch integer)
RETURNS TABLE (pruned_steps integer, pruned_evidence integer, pruned_decisions integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = {path}
AS $$
BEGIN
    -- The database's clock decides what is old: a cutoff past its now() comes from a
    -- client whose clock runs ahead, and would remove history closed moments ago.
    IF p_cutoff IS NULL OR p_cutoff > now() THEN
        RAISE EXCEPTION 'evq: prune cutoff % is later than the database''s clock (%)', p_cutoff, now()
            USING ERRCODE = 'invalid_parameter_value', HINT = 'compute the cutoff as now() - interval in the database';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'evq: prune batch size must be positive' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- On for this statement, off again before returning (an error aborts the whole
    -- transaction). PostgreSQL 15 lets only a superuser put a custom setting in a
    -- function's SET clause, hence set_config. The trigger trusts the switch only
    -- from the owner, so a session that sets it itself gains nothing.
    PERFORM set_config('evq.pruning', 'on', true);
    RETURN QUERY
    WITH roots AS (
        SELECT s.id, s.decision_id
        FROM email_steps s
        WHERE {roots}
        LIMIT p_limit
        FOR UPDATE OF s SKIP LOCKED
    ), riders AS (
        -- A root's notices are all eligible (the root's predicate says so): lock them
        -- and delete them in the same statement, so the foreign key holds at its end.
        SELECT n.id, n.decision_id FROM email_steps n WHERE n.notice_of IN (SELECT id FROM roots)
        FOR UPDATE OF n
    ), doomed AS (
        SELECT id, decision_id FROM roots UNION ALL SELECT id, decision_id FROM riders
    ), ev AS (
        DELETE FROM evidence e USING doomed d WHERE e.step_id = d.id RETURNING e.id
    ), st AS (
        -- Reading ev's count makes the evidence go first: the append-only trigger lets
        -- evidence go only while its step is still there, and terminal.
        DELETE FROM email_steps s USING doomed d
        WHERE s.id = d.id AND (SELECT count(*) FROM ev) >= 0
        RETURNING s.id, s.decision_id
    ), dec AS (
        DELETE FROM decisions x WHERE x.id IN (SELECT decision_id FROM st) RETURNING x.id
    ), counts AS (
        SELECT (SELECT count(*) FROM st)::int AS steps, (SELECT count(*) FROM ev)::int AS evidence,
               (SELECT count(*) FROM dec)::int AS decisions, (SELECT min(id) FROM st) AS first_step_id,
               (SELECT max(id) FROM st) AS last_step_id
    ), logged AS (
        INSERT INTO prune_log (run, batch, actor, cutoff, steps, evidence, decisions, first_step_id, last_step_id)
        SELECT p_run, p_batch, p_actor, p_cutoff, c.steps, c.evidence, c.decisions, c.first_step_id, c.last_step_id
        FROM counts c
        WHERE c.steps > 0
    )
    SELECT c.steps, c.evidence, c.decisions FROM counts c;
    PERFORM set_config('evq.pruning', '', true);
END
$$
""",
        # A definer function is callable by PUBLIC unless revoked: only roles granted
        # the runtime's privileges (evq_grant_runtime) may prune.
        "REVOKE ALL ON FUNCTION evq_prune_batch(timestamptz, integer, text, uuid, integer) FROM PUBLIC",
    ]


# The runtime role's privileges, table by table. A table this list does not name
# (one a later revision adds) gets SELECT, INSERT, UPDATE and DELETE: it is queue
# state, not history. History tables must be named here.
GRANT_RUNTIME = """
CREATE FUNCTION evq_grant_runtime(p_role name) RETURNS text[]
LANGUAGE plpgsql SET search_path = {path} AS $$
DECLARE
    schema_oid oid := (SELECT c.relnamespace FROM pg_class c WHERE c.oid = 'email_steps'::regclass);
    schema_name name := (SELECT n.nspname FROM pg_namespace n WHERE n.oid = schema_oid);
    owner_oid oid := (SELECT c.relowner FROM pg_class c WHERE c.oid = 'email_steps'::regclass);
    r pg_roles%ROWTYPE;
    t record;
    privileges text;
    done text[] := '{{}}';
BEGIN
    SELECT * INTO r FROM pg_roles WHERE rolname = p_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'evq: role % does not exist', p_role
            USING ERRCODE = 'undefined_object', HINT = 'create it first, e.g. CREATE ROLE evq_app LOGIN PASSWORD ''...''';
    END IF;
    IF r.rolsuper OR r.rolbypassrls OR pg_has_role(r.oid, owner_oid, 'MEMBER') THEN
        RAISE EXCEPTION 'evq: role % can act as the owner of evq''s tables (superuser, or a member of %): it could rewrite history',
            p_role, pg_get_userbyid(owner_oid)
            USING ERRCODE = 'invalid_grant_operation', HINT = 'use a role of its own, with no membership in the owner role';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = schema_oid AND c.relowner = r.oid) THEN
        RAISE EXCEPTION 'evq: role % owns objects in schema %: an owner can drop or alter them', p_role, schema_name
            USING ERRCODE = 'invalid_grant_operation', HINT = 'reassign them to the owner: REASSIGN OWNED BY ... TO ...';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, p_role);
    -- PostgreSQL before 15 lets PUBLIC create in the public schema: the runtime role
    -- could add its own tables and functions beside evq's.
    IF EXISTS (
        SELECT 1 FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
        WHERE n.oid = schema_oid AND a.grantee = 0 AND a.privilege_type = 'CREATE'
    ) THEN
        EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM PUBLIC', schema_name);
    END IF;
    IF has_schema_privilege(r.oid, schema_oid, 'CREATE') THEN
        EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM %I', schema_name, p_role);
    END IF;
    FOR t IN
        SELECT c.relname, c.relkind FROM pg_class c
        WHERE c.relnamespace = schema_oid AND c.relowner = owner_oid AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
        ORDER BY c.relname
    LOOP
        IF t.relkind = 'S' THEN
            EXECUTE format('REVOKE ALL ON SEQUENCE %I.%I FROM %I', schema_name, t.relname, p_role);
            EXECUTE format('GRANT USAGE, SELECT ON SEQUENCE %I.%I TO %I', schema_name, t.relname, p_role);
            CONTINUE;
        END IF;
        privileges := CASE t.relname
            WHEN 'evidence' THEN 'SELECT, INSERT'          -- append-only
            WHEN 'decisions' THEN 'SELECT, INSERT'         -- append-only
            WHEN 'prune_log' THEN 'SELECT'                 -- written by evq_prune_batch only
            WHEN 'alembic_version' THEN 'SELECT'           -- the schema check reads it
            WHEN 'email_steps' THEN 'SELECT, INSERT, UPDATE'  -- steps go only through evq_prune_batch
            WHEN 'api_keys' THEN 'SELECT, INSERT, UPDATE'  -- revoked, never deleted
            ELSE 'SELECT, INSERT, UPDATE, DELETE'
        END;
        EXECUTE format('REVOKE ALL ON TABLE %I.%I FROM %I', schema_name, t.relname, p_role);
        EXECUTE format('GRANT %s ON TABLE %I.%I TO %I', privileges, schema_name, t.relname, p_role);
        done := done || (t.relname::text || ': ' || privileges);
    END LOOP;
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_prune_batch(timestamptz, integer, text, uuid, integer) TO %I',
                   schema_name, p_role);
    RETURN done;
END
$$
"""


def upgrade() -> None:
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    path = f"pg_catalog, {_quoted(schema)}, pg_temp"
    # A failure notice's reverse lookup: the prune predicate asks "does a notice point
    # at this step?", and the foreign key asks the same for every step it deletes.
    op.create_index(
        "ix_email_steps_notice_of",
        "email_steps",
        ["notice_of"],
        unique=False,
        postgresql_where=sa.text("notice_of IS NOT NULL"),
    )
    op.execute(APPEND_ONLY_OWNER_ONLY)
    for statement in _prune_functions(schema):
        op.execute(statement)
    op.execute(GRANT_RUNTIME.format(path=path))
    op.execute("REVOKE ALL ON FUNCTION evq_grant_runtime(name) FROM PUBLIC")


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS evq_grant_runtime(name)")
    op.execute("DROP FUNCTION IF EXISTS evq_prune_batch(timestamptz, integer, text, uuid, integer)")
    op.execute("DROP FUNCTION IF EXISTS evq_prune_count(timestamptz)")
    op.execute(APPEND_ONLY_0004)
    op.drop_index(
        "ix_email_steps_notice_of", table_name="email_steps", postgresql_where=sa.text("notice_of IS NOT NULL")
    )
