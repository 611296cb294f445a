-- History that the application's own role cannot rewrite (invariant 11; docs/design.md,
-- "Database roles"): the role that runs `evq admin db-upgrade` owns everything; workers,
-- `evq admin serve` and `evq admin mcp` connect as a runtime role that evq_grant_runtime(role)
-- grants exactly what they need (`evq admin db-upgrade --runtime-role NAME` calls it, and every
-- later upgrade calls it again for each role granted before, so a table a later revision adds
-- reaches them): no ownership, no DDL, no DELETE of steps, no UPDATE or DELETE of history.
--
-- Privileges go by table name. A table the CASE does not name gets queue state's (SELECT,
-- INSERT, UPDATE, DELETE): a history table must be named here. A partition gets nothing (the
-- runtime role reads and writes evidence through its parent).
CREATE FUNCTION evq_grant_runtime(p_role name) RETURNS text[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    schema_oid oid := (SELECT c.relnamespace FROM pg_class c WHERE c.oid = 'email_steps'::regclass);
    schema_name name := (SELECT n.nspname FROM pg_namespace n WHERE n.oid = schema_oid);
    owner_oid oid := (SELECT c.relowner FROM pg_class c WHERE c.oid = 'email_steps'::regclass);
    r pg_roles%ROWTYPE;
    t record;
    privileges text;
    done text[] := '{}';
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
          AND NOT c.relispartition
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
            WHEN 'api_key_pepper' THEN 'SELECT'            -- read by key checks, written by migrations only
            WHEN 'provider_circuit_events' THEN 'SELECT, INSERT'  -- append-only
            WHEN 'enqueue_refusals' THEN 'SELECT, INSERT, DELETE'  -- recorded, pruned, never rewritten
            WHEN 'enqueue_refusal_counts' THEN 'SELECT, INSERT, UPDATE'  -- a counter: only grows
            WHEN 'key_events' THEN 'SELECT, INSERT'        -- append-only
            WHEN 'delivery_events' THEN 'SELECT, INSERT'   -- append-only
            -- insert-once, an enqueue's columns only; a step's end is the prune's
            WHEN 'step_keys' THEN
                'SELECT, INSERT (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256, created_at)'
            WHEN 'prune_log' THEN 'SELECT'                 -- written by evq_prune_batch only
            WHEN 'alembic_version' THEN 'SELECT'           -- the schema check reads it
            WHEN 'email_steps' THEN 'SELECT, INSERT, UPDATE'  -- steps go only through evq_prune_batch
            WHEN 'steps_now' THEN 'SELECT'                 -- a view
            WHEN 'api_keys' THEN 'SELECT, INSERT, UPDATE'  -- revoked, never deleted
            ELSE 'SELECT, INSERT, UPDATE, DELETE'
        END;
        EXECUTE format('REVOKE ALL ON TABLE %I.%I FROM %I', schema_name, t.relname, p_role);
        EXECUTE format('GRANT %s ON TABLE %I.%I TO %I', privileges, schema_name, t.relname, p_role);
        done := done || (t.relname::text || ': ' || privileges);
    END LOOP;
    -- The owner's functions the runtime role runs: retention (prune.sql) and the evidence
    -- partitions (partitions.sql), made ahead by the worker and dropped by evq prune.
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_prune_batch(timestamptz, integer, text, uuid, integer) TO %I',
                   schema_name, p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_redact_batch(interval, integer, text) TO %I',
                   schema_name, p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_evidence_partitions_ahead(bigint) TO %I', schema_name, p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_evidence_seal(timestamptz, bigint) TO %I', schema_name, p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_evidence_unseal(text) TO %I', schema_name, p_role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.evq_evidence_drop(text, timestamptz, text, uuid, integer) TO %I',
                   schema_name, p_role);
    RETURN done;
END
$$;

-- Granting is the owner's (evq admin db-upgrade runs as it).
REVOKE ALL ON FUNCTION evq_grant_runtime(name) FROM PUBLIC;
