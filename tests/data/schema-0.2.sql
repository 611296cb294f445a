--
-- PostgreSQL database dump
--


-- Dumped from database version 15.20 (Debian 15.20-0+deb12u1)
-- Dumped by pg_dump version 15.20 (Debian 15.20-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: evq_append_only(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evq_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
$$;


--
-- Name: evq_grant_runtime(name); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evq_grant_runtime(p_role name) RETURNS text[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
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
$$;


--
-- Name: evq_prune_batch(timestamp with time zone, integer, text, uuid, integer); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evq_prune_batch(p_cutoff timestamp with time zone, p_limit integer, p_actor text, p_run uuid, p_batch integer) RETURNS TABLE(pruned_steps integer, pruned_evidence integer, pruned_decisions integer)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
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
        WHERE 
    
    s.status IN ('accepted', 'rejected') AND s.created_at < p_cutoff AND s.closed_at < p_cutoff
    AND NOT EXISTS (
        SELECT 1 FROM email_steps n
        WHERE n.notice_of = s.id
          AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff AND n.closed_at < p_cutoff)
    )

    AND NOT (s.notice_of IS NOT NULL AND EXISTS (
        SELECT 1 FROM email_steps o WHERE o.id = s.notice_of AND 
    o.status IN ('accepted', 'rejected') AND o.created_at < p_cutoff AND o.closed_at < p_cutoff
    AND NOT EXISTS (
        SELECT 1 FROM email_steps n
        WHERE n.notice_of = o.id
          AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff AND n.closed_at < p_cutoff)
    )

    ))
    
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
$$;


--
-- Name: evq_prune_count(timestamp with time zone); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evq_prune_count(p_cutoff timestamp with time zone) RETURNS TABLE(pruned_steps bigint, pruned_evidence bigint, pruned_decisions bigint)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'public', 'pg_temp'
    AS $$
    WITH roots AS (
        SELECT s.id, s.decision_id FROM email_steps s WHERE 
    
    s.status IN ('accepted', 'rejected') AND s.created_at < p_cutoff AND s.closed_at < p_cutoff
    AND NOT EXISTS (
        SELECT 1 FROM email_steps n
        WHERE n.notice_of = s.id
          AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff AND n.closed_at < p_cutoff)
    )

    AND NOT (s.notice_of IS NOT NULL AND EXISTS (
        SELECT 1 FROM email_steps o WHERE o.id = s.notice_of AND 
    o.status IN ('accepted', 'rejected') AND o.created_at < p_cutoff AND o.closed_at < p_cutoff
    AND NOT EXISTS (
        SELECT 1 FROM email_steps n
        WHERE n.notice_of = o.id
          AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff AND n.closed_at < p_cutoff)
    )

    ))
    
    ), doomed AS (
        SELECT id, decision_id FROM roots
        UNION ALL
        SELECT n.id, n.decision_id FROM email_steps n JOIN roots r ON n.notice_of = r.id
    )
    SELECT (SELECT count(*) FROM doomed),
           (SELECT count(*) FROM evidence e JOIN doomed d ON d.id = e.step_id),
           (SELECT count(DISTINCT decision_id) FROM doomed)
$$;


--
-- Name: evq_step_guard(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.evq_step_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.run_id IS DISTINCT FROM OLD.run_id OR NEW.step_id IS DISTINCT FROM OLD.step_id OR NEW.decision_id IS DISTINCT FROM OLD.decision_id OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key OR NEW.message_id IS DISTINCT FROM OLD.message_id OR NEW.provider IS DISTINCT FROM OLD.provider OR NEW.payload IS DISTINCT FROM OLD.payload OR NEW.payload_sha256 IS DISTINCT FROM OLD.payload_sha256 OR NEW.notify IS DISTINCT FROM OLD.notify OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
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
$$;


SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: alembic_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.alembic_version (
    version_num character varying(32) NOT NULL
);


--
-- Name: api_key_pepper; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.api_key_pepper (
    id smallint DEFAULT 1 NOT NULL,
    pepper bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_api_key_pepper_long_enough CHECK ((octet_length(pepper) >= 32)),
    CONSTRAINT ck_api_key_pepper_one_row CHECK ((id = 1))
);


--
-- Name: api_keys; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.api_keys (
    id bigint NOT NULL,
    name text NOT NULL,
    role text NOT NULL,
    key_id text NOT NULL,
    secret_hash text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    created_by text,
    revoked_at timestamp with time zone,
    revoked_by text,
    session_generation integer DEFAULT 0 NOT NULL,
    CONSTRAINT ck_api_keys_key_id_format CHECK ((key_id ~ '^[0-9a-f]{12}$'::text)),
    CONSTRAINT ck_api_keys_revoked_by_when_revoked CHECK (((revoked_by IS NULL) OR (revoked_at IS NOT NULL))),
    CONSTRAINT ck_api_keys_role CHECK ((role = ANY (ARRAY['agent'::text, 'operator'::text, 'admin'::text]))),
    CONSTRAINT ck_api_keys_secret_hash_scheme CHECK (((secret_hash ~~ 'scrypt$%'::text) OR (secret_hash ~~ 'hmac-sha256$%'::text)))
);


--
-- Name: api_keys_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.api_keys_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: api_keys_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.api_keys_id_seq OWNED BY public.api_keys.id;


--
-- Name: decisions; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.decisions (
    id bigint NOT NULL,
    run_id text NOT NULL,
    step_id text NOT NULL,
    intent text,
    instruction_version text,
    prompt_version text,
    model text,
    tool text,
    rationale jsonb,
    decided_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);


--
-- Name: decisions_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.decisions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: decisions_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.decisions_id_seq OWNED BY public.decisions.id;


--
-- Name: email_steps; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.email_steps (
    id bigint NOT NULL,
    run_id text NOT NULL,
    step_id text NOT NULL,
    decision_id bigint NOT NULL,
    idempotency_key text NOT NULL,
    message_id text NOT NULL,
    provider text NOT NULL,
    payload jsonb NOT NULL,
    payload_sha256 text NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    reason text,
    detail text,
    attempts integer DEFAULT 0 NOT NULL,
    max_attempts integer,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    dedupe_until timestamp with time zone,
    maybe_delivered boolean DEFAULT false NOT NULL,
    provider_message_id text,
    notify text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    first_attempt_at timestamp with time zone,
    unknown_since timestamp with time zone,
    closed_at timestamp with time zone,
    notice_of bigint,
    reconcile_after timestamp with time zone,
    reconcile_checks integer DEFAULT 0 NOT NULL,
    uncharged_attempts integer DEFAULT 0 NOT NULL,
    retry_from timestamp with time zone,
    CONSTRAINT ck_email_steps_attempts_nonnegative CHECK ((attempts >= 0)),
    CONSTRAINT ck_email_steps_closed_iff_terminal CHECK (((status = ANY (ARRAY['accepted'::text, 'rejected'::text])) = (closed_at IS NOT NULL))),
    CONSTRAINT ck_email_steps_first_attempt_iff_attempted CHECK (((attempts = 0) = (first_attempt_at IS NULL))),
    CONSTRAINT ck_email_steps_idempotency_key_length CHECK (((length(idempotency_key) >= 1) AND (length(idempotency_key) <= 512))),
    CONSTRAINT ck_email_steps_in_flight_counts_attempt CHECK (((status <> 'in_flight'::text) OR (attempts >= 1))),
    CONSTRAINT ck_email_steps_lease_iff_in_flight CHECK (((status = 'in_flight'::text) = ((lease_token IS NOT NULL) AND (lease_owner IS NOT NULL) AND (lease_expires_at IS NOT NULL)))),
    CONSTRAINT ck_email_steps_max_attempts_positive CHECK (((max_attempts IS NULL) OR (max_attempts >= 1))),
    CONSTRAINT ck_email_steps_maybe_delivered_after_attempt CHECK (((NOT maybe_delivered) OR (attempts >= 1))),
    CONSTRAINT ck_email_steps_message_id_format CHECK ((message_id ~ '^<[^<>@[:space:]]+@[^<>@[:space:]]+>$'::text)),
    CONSTRAINT ck_email_steps_notice_never_notifies CHECK (((notice_of IS NULL) OR (notify IS NULL))),
    CONSTRAINT ck_email_steps_payload_object CHECK ((jsonb_typeof(payload) = 'object'::text)),
    CONSTRAINT ck_email_steps_payload_sha256_hex CHECK ((payload_sha256 ~ '^[0-9a-f]{64}$'::text)),
    CONSTRAINT ck_email_steps_reconcile_checks_nonnegative CHECK ((reconcile_checks >= 0)),
    CONSTRAINT ck_email_steps_status CHECK ((status = ANY (ARRAY['pending'::text, 'in_flight'::text, 'retryable'::text, 'unknown'::text, 'accepted'::text, 'rejected'::text]))),
    CONSTRAINT ck_email_steps_uncharged_within_attempts CHECK (((uncharged_attempts >= 0) AND (uncharged_attempts <= attempts))),
    CONSTRAINT ck_email_steps_unknown_since_iff_unknown CHECK (((status = 'unknown'::text) = (unknown_since IS NOT NULL)))
);


--
-- Name: email_steps_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.email_steps_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: email_steps_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.email_steps_id_seq OWNED BY public.email_steps.id;


--
-- Name: evidence; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.evidence (
    id bigint NOT NULL,
    step_id bigint NOT NULL,
    run_id text NOT NULL,
    attempt integer,
    kind text NOT NULL,
    actor text NOT NULL,
    from_status text,
    to_status text,
    outcome text,
    reason text,
    provider_message_id text,
    lease_token uuid,
    latency_ms double precision,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_evidence_attempt_rows_carry_lease CHECK (((kind <> ALL (ARRAY['attempt_started'::text, 'provider_response'::text, 'late_response'::text])) OR ((attempt IS NOT NULL) AND (lease_token IS NOT NULL)))),
    CONSTRAINT ck_evidence_from_status CHECK (((from_status IS NULL) OR (from_status = ANY (ARRAY['pending'::text, 'in_flight'::text, 'retryable'::text, 'unknown'::text, 'accepted'::text, 'rejected'::text])))),
    CONSTRAINT ck_evidence_kind CHECK ((kind = ANY (ARRAY['attempt_started'::text, 'provider_response'::text, 'late_response'::text, 'attempt_released'::text, 'lease_expired'::text, 'window_closed'::text, 'reconciled'::text, 'operator_resolved'::text, 'notice_enqueued'::text]))),
    CONSTRAINT ck_evidence_outcome CHECK (((outcome IS NULL) OR (outcome = ANY (ARRAY['accepted'::text, 'rejected'::text, 'retryable'::text, 'unknown'::text])))),
    CONSTRAINT ck_evidence_to_status CHECK (((to_status IS NULL) OR (to_status = ANY (ARRAY['pending'::text, 'in_flight'::text, 'retryable'::text, 'unknown'::text, 'accepted'::text, 'rejected'::text]))))
);


--
-- Name: evidence_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.evidence_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: evidence_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.evidence_id_seq OWNED BY public.evidence.id;


--
-- Name: provider_circuit_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.provider_circuit_events (
    id bigint NOT NULL,
    provider text NOT NULL,
    from_state text NOT NULL,
    to_state text NOT NULL,
    reason text,
    detail text,
    actor text NOT NULL,
    probe_in double precision,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_provider_circuit_events_from_state CHECK ((from_state = ANY (ARRAY['closed'::text, 'half_open'::text, 'open'::text]))),
    CONSTRAINT ck_provider_circuit_events_to_state CHECK ((to_state = ANY (ARRAY['closed'::text, 'half_open'::text, 'open'::text])))
);


--
-- Name: provider_circuit_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.provider_circuit_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: provider_circuit_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.provider_circuit_events_id_seq OWNED BY public.provider_circuit_events.id;


--
-- Name: provider_circuits; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.provider_circuits (
    provider text NOT NULL,
    state text NOT NULL,
    reason text,
    detail text,
    opened_at timestamp with time zone,
    probe_at timestamp with time zone,
    probes integer DEFAULT 0 NOT NULL,
    probe_owner text,
    probe_expires_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_provider_circuits_opened_iff_not_closed CHECK (((state = 'closed'::text) = (opened_at IS NULL))),
    CONSTRAINT ck_provider_circuits_probe_at_iff_open CHECK (((state = 'open'::text) = (probe_at IS NOT NULL))),
    CONSTRAINT ck_provider_circuits_probe_held_iff_half_open CHECK (((state = 'half_open'::text) = ((probe_owner IS NOT NULL) AND (probe_expires_at IS NOT NULL)))),
    CONSTRAINT ck_provider_circuits_probes_nonnegative CHECK ((probes >= 0)),
    CONSTRAINT ck_provider_circuits_state CHECK ((state = ANY (ARRAY['closed'::text, 'half_open'::text, 'open'::text])))
);


--
-- Name: provider_rate_limits; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.provider_rate_limits (
    provider text NOT NULL,
    tokens double precision NOT NULL,
    refilled_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_until timestamp with time zone,
    CONSTRAINT ck_provider_rate_limits_tokens_not_negative CHECK ((tokens >= (0)::double precision))
);


--
-- Name: prune_log; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.prune_log (
    id bigint NOT NULL,
    run uuid NOT NULL,
    batch integer NOT NULL,
    actor text NOT NULL,
    cutoff timestamp with time zone NOT NULL,
    steps integer NOT NULL,
    evidence integer NOT NULL,
    decisions integer NOT NULL,
    first_step_id bigint,
    last_step_id bigint,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_prune_log_counts_nonnegative CHECK (((steps >= 0) AND (evidence >= 0) AND (decisions >= 0)))
);


--
-- Name: prune_log_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.prune_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: prune_log_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.prune_log_id_seq OWNED BY public.prune_log.id;


--
-- Name: api_keys id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys ALTER COLUMN id SET DEFAULT nextval('public.api_keys_id_seq'::regclass);


--
-- Name: decisions id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decisions ALTER COLUMN id SET DEFAULT nextval('public.decisions_id_seq'::regclass);


--
-- Name: email_steps id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps ALTER COLUMN id SET DEFAULT nextval('public.email_steps_id_seq'::regclass);


--
-- Name: evidence id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evidence ALTER COLUMN id SET DEFAULT nextval('public.evidence_id_seq'::regclass);


--
-- Name: provider_circuit_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.provider_circuit_events ALTER COLUMN id SET DEFAULT nextval('public.provider_circuit_events_id_seq'::regclass);


--
-- Name: prune_log id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.prune_log ALTER COLUMN id SET DEFAULT nextval('public.prune_log_id_seq'::regclass);


--
-- Name: alembic_version alembic_version_pkc; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);


--
-- Name: api_key_pepper pk_api_key_pepper; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_key_pepper
    ADD CONSTRAINT pk_api_key_pepper PRIMARY KEY (id);


--
-- Name: api_keys pk_api_keys; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT pk_api_keys PRIMARY KEY (id);


--
-- Name: decisions pk_decisions; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.decisions
    ADD CONSTRAINT pk_decisions PRIMARY KEY (id);


--
-- Name: email_steps pk_email_steps; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps
    ADD CONSTRAINT pk_email_steps PRIMARY KEY (id);


--
-- Name: evidence pk_evidence; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evidence
    ADD CONSTRAINT pk_evidence PRIMARY KEY (id);


--
-- Name: provider_circuit_events pk_provider_circuit_events; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.provider_circuit_events
    ADD CONSTRAINT pk_provider_circuit_events PRIMARY KEY (id);


--
-- Name: provider_circuits pk_provider_circuits; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.provider_circuits
    ADD CONSTRAINT pk_provider_circuits PRIMARY KEY (provider);


--
-- Name: provider_rate_limits pk_provider_rate_limits; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.provider_rate_limits
    ADD CONSTRAINT pk_provider_rate_limits PRIMARY KEY (provider);


--
-- Name: prune_log pk_prune_log; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.prune_log
    ADD CONSTRAINT pk_prune_log PRIMARY KEY (id);


--
-- Name: api_keys uq_api_keys_key_id; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT uq_api_keys_key_id UNIQUE (key_id);


--
-- Name: api_keys uq_api_keys_name; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.api_keys
    ADD CONSTRAINT uq_api_keys_name UNIQUE (name);


--
-- Name: email_steps uq_email_steps_idempotency_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps
    ADD CONSTRAINT uq_email_steps_idempotency_key UNIQUE (idempotency_key);


--
-- Name: email_steps uq_email_steps_message_id; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps
    ADD CONSTRAINT uq_email_steps_message_id UNIQUE (message_id);


--
-- Name: email_steps uq_email_steps_run_id_step_id; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps
    ADD CONSTRAINT uq_email_steps_run_id_step_id UNIQUE (run_id, step_id);


--
-- Name: prune_log uq_prune_log_run_batch; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.prune_log
    ADD CONSTRAINT uq_prune_log_run_batch UNIQUE (run, batch);


--
-- Name: ix_decisions_run_id_created_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_decisions_run_id_created_at ON public.decisions USING btree (run_id, created_at);


--
-- Name: ix_email_steps_claimable; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_email_steps_claimable ON public.email_steps USING btree (next_attempt_at, id) WHERE (status = ANY (ARRAY['pending'::text, 'retryable'::text]));


--
-- Name: ix_email_steps_decision_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_email_steps_decision_id ON public.email_steps USING btree (decision_id);


--
-- Name: ix_email_steps_lease_expiry; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_email_steps_lease_expiry ON public.email_steps USING btree (lease_expires_at) WHERE (status = 'in_flight'::text);


--
-- Name: ix_email_steps_notice_of; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_email_steps_notice_of ON public.email_steps USING btree (notice_of) WHERE (notice_of IS NOT NULL);


--
-- Name: ix_email_steps_status_created_at; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_email_steps_status_created_at ON public.email_steps USING btree (status, created_at) WHERE (status <> 'in_flight'::text);


--
-- Name: ix_email_steps_unknown_since; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_email_steps_unknown_since ON public.email_steps USING btree (unknown_since, id) WHERE (status = 'unknown'::text);


--
-- Name: ix_evidence_step_id_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_evidence_step_id_id ON public.evidence USING btree (step_id, id);


--
-- Name: ix_provider_circuit_events_provider_id; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_provider_circuit_events_provider_id ON public.provider_circuit_events USING btree (provider, id);


--
-- Name: uq_evidence_answer_per_lease; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX uq_evidence_answer_per_lease ON public.evidence USING btree (lease_token) WHERE (kind = ANY (ARRAY['provider_response'::text, 'late_response'::text]));


--
-- Name: decisions decisions_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER decisions_append_only BEFORE DELETE OR UPDATE ON public.decisions FOR EACH ROW EXECUTE FUNCTION public.evq_append_only();


--
-- Name: decisions decisions_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER decisions_no_truncate BEFORE TRUNCATE ON public.decisions FOR EACH STATEMENT EXECUTE FUNCTION public.evq_append_only();


--
-- Name: email_steps email_steps_guard; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER email_steps_guard BEFORE UPDATE ON public.email_steps FOR EACH ROW EXECUTE FUNCTION public.evq_step_guard();


--
-- Name: evidence evidence_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER evidence_append_only BEFORE DELETE OR UPDATE ON public.evidence FOR EACH ROW EXECUTE FUNCTION public.evq_append_only();


--
-- Name: evidence evidence_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER evidence_no_truncate BEFORE TRUNCATE ON public.evidence FOR EACH STATEMENT EXECUTE FUNCTION public.evq_append_only();


--
-- Name: provider_circuit_events provider_circuit_events_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER provider_circuit_events_append_only BEFORE DELETE OR UPDATE ON public.provider_circuit_events FOR EACH ROW EXECUTE FUNCTION public.evq_append_only();


--
-- Name: provider_circuit_events provider_circuit_events_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER provider_circuit_events_no_truncate BEFORE TRUNCATE ON public.provider_circuit_events FOR EACH STATEMENT EXECUTE FUNCTION public.evq_append_only();


--
-- Name: prune_log prune_log_append_only; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER prune_log_append_only BEFORE DELETE OR UPDATE ON public.prune_log FOR EACH ROW EXECUTE FUNCTION public.evq_append_only();


--
-- Name: prune_log prune_log_no_truncate; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER prune_log_no_truncate BEFORE TRUNCATE ON public.prune_log FOR EACH STATEMENT EXECUTE FUNCTION public.evq_append_only();


--
-- Name: email_steps fk_email_steps_decision_id_decisions; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps
    ADD CONSTRAINT fk_email_steps_decision_id_decisions FOREIGN KEY (decision_id) REFERENCES public.decisions(id);


--
-- Name: email_steps fk_email_steps_notice_of_email_steps; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.email_steps
    ADD CONSTRAINT fk_email_steps_notice_of_email_steps FOREIGN KEY (notice_of) REFERENCES public.email_steps(id);


--
-- Name: evidence fk_evidence_step_id_email_steps; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.evidence
    ADD CONSTRAINT fk_evidence_step_id_email_steps FOREIGN KEY (step_id) REFERENCES public.email_steps(id);


--
-- Name: FUNCTION evq_grant_runtime(p_role name); Type: ACL; Schema: public; Owner: -
--

REVOKE ALL ON FUNCTION public.evq_grant_runtime(p_role name) FROM PUBLIC;


--
-- Name: FUNCTION evq_prune_batch(p_cutoff timestamp with time zone, p_limit integer, p_actor text, p_run uuid, p_batch integer); Type: ACL; Schema: public; Owner: -
--

REVOKE ALL ON FUNCTION public.evq_prune_batch(p_cutoff timestamp with time zone, p_limit integer, p_actor text, p_run uuid, p_batch integer) FROM PUBLIC;


--
-- PostgreSQL database dump complete
--


