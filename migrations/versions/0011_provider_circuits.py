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
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision: str = '0011_provider_circuits'
down_revision: Union[str, Sequence[str], None] = '0009_runtime_role'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


# evq_grant_runtime as 0009 wrote it, with one more line per history table this
# revision adds ({extra}); the downgrade writes it back without.
GRANT_RUNTIME = """
CREATE OR REPLACE FUNCTION evq_grant_runtime(p_role name) RETURNS text[]
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
{extra}            WHEN 'alembic_version' THEN 'SELECT'           -- the schema check reads it
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


EVENTS_LINE = "            WHEN 'provider_circuit_events' THEN 'SELECT, INSERT'  -- append-only\n"

TZ = postgresql.TIMESTAMP(timezone=True)


def _grant_function(extra: str) -> str:
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    path = f"pg_catalog, {_quoted(schema)}, pg_temp"
    return GRANT_RUNTIME.replace("{extra}", extra).format(path=path)


def upgrade() -> None:
    op.add_column('email_steps', sa.Column('uncharged_attempts', sa.Integer(), server_default='0', nullable=False))
    op.add_column('email_steps', sa.Column('retry_from', TZ, nullable=True))
    op.create_check_constraint(
        op.f('ck_email_steps_uncharged_within_attempts'), 'email_steps',
        'uncharged_attempts >= 0 AND uncharged_attempts <= attempts',
    )
    op.create_table('provider_circuits',
    sa.Column('provider', sa.Text(), nullable=False),
    sa.Column('state', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('opened_at', TZ, nullable=True),
    sa.Column('probe_at', TZ, nullable=True),
    sa.Column('probes', sa.Integer(), server_default='0', nullable=False),
    sa.Column('probe_owner', sa.Text(), nullable=True),
    sa.Column('probe_expires_at', TZ, nullable=True),
    sa.Column('updated_at', TZ, server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("state IN ('closed', 'half_open', 'open')", name=op.f('ck_provider_circuits_state')),
    sa.CheckConstraint("(state = 'closed') = (opened_at IS NULL)", name=op.f('ck_provider_circuits_opened_iff_not_closed')),
    sa.CheckConstraint("(state = 'open') = (probe_at IS NOT NULL)", name=op.f('ck_provider_circuits_probe_at_iff_open')),
    sa.CheckConstraint("(state = 'half_open') = (probe_owner IS NOT NULL AND probe_expires_at IS NOT NULL)", name=op.f('ck_provider_circuits_probe_held_iff_half_open')),
    sa.CheckConstraint('probes >= 0', name=op.f('ck_provider_circuits_probes_nonnegative')),
    sa.PrimaryKeyConstraint('provider', name=op.f('pk_provider_circuits'))
    )
    op.create_table('provider_circuit_events',
    sa.Column('id', sa.BigInteger(), autoincrement=True, nullable=False),
    sa.Column('provider', sa.Text(), nullable=False),
    sa.Column('from_state', sa.Text(), nullable=False),
    sa.Column('to_state', sa.Text(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('detail', sa.Text(), nullable=True),
    sa.Column('actor', sa.Text(), nullable=False),
    sa.Column('probe_in', sa.Float(), nullable=True),
    sa.Column('created_at', TZ, server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("from_state IN ('closed', 'half_open', 'open')", name=op.f('ck_provider_circuit_events_from_state')),
    sa.CheckConstraint("to_state IN ('closed', 'half_open', 'open')", name=op.f('ck_provider_circuit_events_to_state')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_provider_circuit_events'))
    )
    op.create_index(op.f('ix_provider_circuit_events_provider_id'), 'provider_circuit_events', ['provider', 'id'], unique=False)
    op.execute(
        "CREATE TRIGGER provider_circuit_events_append_only BEFORE UPDATE OR DELETE ON provider_circuit_events "
        "FOR EACH ROW EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER provider_circuit_events_no_truncate BEFORE TRUNCATE ON provider_circuit_events "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(_grant_function(EVENTS_LINE))
    op.execute("REVOKE ALL ON FUNCTION evq_grant_runtime(name) FROM PUBLIC")


def downgrade() -> None:
    op.execute(_grant_function(""))
    op.execute("REVOKE ALL ON FUNCTION evq_grant_runtime(name) FROM PUBLIC")
    op.execute("DROP TRIGGER IF EXISTS provider_circuit_events_append_only ON provider_circuit_events")
    op.execute("DROP TRIGGER IF EXISTS provider_circuit_events_no_truncate ON provider_circuit_events")
    op.drop_index(op.f('ix_provider_circuit_events_provider_id'), table_name='provider_circuit_events')
    op.drop_table('provider_circuit_events')
    op.drop_table('provider_circuits')
    op.drop_constraint(op.f('ck_email_steps_uncharged_within_attempts'), 'email_steps', type_='check')
    op.drop_column('email_steps', 'retry_from')
    op.drop_column('email_steps', 'uncharged_attempts')
