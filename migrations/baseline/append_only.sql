-- History is appended, never rewritten (invariant 5; docs/design.md, "Data model"). The
-- triggers hold even for a role that owns the tables, so no evq command and no hand-written SQL
-- through the application's role can change what happened.
--
-- The functions here and in the other files say SET search_path FROM CURRENT: the baseline
-- runs them with search_path = evq's schema, pg_temp (pg_catalog is searched first when the
-- path does not name it), and that path is kept with each function. A session's temporary
-- tables then come last, so no session can shadow evq's tables (a temporary pg_class or
-- email_steps) inside a trigger or a SECURITY DEFINER function.

-- The one exception is evq prune: a DELETE of evidence or decisions while the prune switch
-- (evq.pruning) is on AND the current user is the table's owner. The switch is a setting any
-- session can set; only evq_prune_batch (prune.sql), which runs as the owner, is trusted with
-- it. Evidence goes only when its step is terminal; a decision only when no step points at it
-- (the foreign key says so). A partition's rows are its table's: evidence_steps_<lo> holds
-- evidence (partitions.sql).
CREATE FUNCTION evq_append_only() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    evq_table name := coalesce((SELECT c.relname FROM pg_class c WHERE c.oid = pg_partition_root(TG_RELID)),
                               TG_TABLE_NAME);
BEGIN
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' AND evq_table IN ('evidence', 'decisions')
       AND coalesce(current_setting('evq.pruning', true), '') = 'on'
       AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        IF evq_table = 'decisions' THEN
            RETURN OLD;  -- the foreign key keeps every decision a step still points at
        END IF;
        IF EXISTS (SELECT 1 FROM email_steps s WHERE s.id = OLD.step_id AND s.status IN ('accepted', 'rejected')) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, evq_table
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'evidence is never changed; append a new row instead (evq prune is the only way to remove old rows)';
END
$$;

-- Append-only: every row trigger refuses UPDATE and DELETE (but evq prune's, above), every
-- statement trigger TRUNCATE. A partition of evidence gets its own TRUNCATE trigger when it
-- is made (partitions.sql): a statement trigger on the parent does not see one of a partition.
CREATE TRIGGER evidence_append_only BEFORE UPDATE OR DELETE ON evidence
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER evidence_no_truncate BEFORE TRUNCATE ON evidence
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER decisions_append_only BEFORE UPDATE OR DELETE ON decisions
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER decisions_no_truncate BEFORE TRUNCATE ON decisions
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
-- Each prune batch's row: written only by evq_prune_batch and evq_evidence_drop, without exception.
CREATE TRIGGER prune_log_append_only BEFORE UPDATE OR DELETE ON prune_log
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER prune_log_no_truncate BEFORE TRUNCATE ON prune_log
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
-- Every change of a provider's circuit, so "why did nothing go out between 14:02 and 14:09"
-- has an answer after it closed again.
CREATE TRIGGER provider_circuit_events_append_only BEFORE UPDATE OR DELETE ON provider_circuit_events
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER provider_circuit_events_no_truncate BEFORE TRUNCATE ON provider_circuit_events
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
-- Each key's event feed (key_events.sql writes it).
CREATE TRIGGER key_events_append_only BEFORE UPDATE OR DELETE ON key_events
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER key_events_no_truncate BEFORE TRUNCATE ON key_events
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
-- What providers' webhooks said, kept as it came.
CREATE TRIGGER delivery_events_append_only BEFORE UPDATE OR DELETE ON delivery_events
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER delivery_events_no_truncate BEFORE TRUNCATE ON delivery_events
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();

-- The key ledger (invariant 12): kept for ever, even from the owner (no DELETE, no TRUNCATE).
-- An enqueue writes a key's row once; evq_prune_batch writes the step's end into it once, in
-- the statement that deletes the step. Any other change is refused: what an enqueue wrote
-- never changes, nor what a prune recorded.
CREATE TRIGGER step_keys_kept BEFORE DELETE ON step_keys
    FOR EACH ROW EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER step_keys_no_truncate BEFORE TRUNCATE ON step_keys
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER step_keys_insert_once BEFORE UPDATE ON step_keys
    FOR EACH ROW WHEN (OLD.pruned_at IS NOT NULL
                       OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key
                       OR OLD.id IS DISTINCT FROM NEW.id
                       OR OLD.run_id IS DISTINCT FROM NEW.run_id
                       OR OLD.step_id IS DISTINCT FROM NEW.step_id
                       OR OLD.message_id IS DISTINCT FROM NEW.message_id
                       OR OLD.provider IS DISTINCT FROM NEW.provider
                       OR OLD.payload_sha256 IS DISTINCT FROM NEW.payload_sha256
                       OR OLD.created_at IS DISTINCT FROM NEW.created_at)
    EXECUTE FUNCTION evq_append_only();

-- The refusal counter behind evq_enqueue_refusals_total: the runtime role needs UPDATE for the
-- increment, and a counter that can go down, or move to another label, is not one (Prometheus
-- would read a reset).
CREATE FUNCTION evq_refusal_count_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.interface IS DISTINCT FROM OLD.interface OR NEW.field IS DISTINCT FROM OLD.field
       OR NEW.total < OLD.total THEN
        RAISE EXCEPTION 'evq: the refusal count (%, %) only grows', OLD.interface, OLD.field
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER enqueue_refusal_counts_only_grow BEFORE UPDATE ON enqueue_refusal_counts
    FOR EACH ROW EXECUTE FUNCTION evq_refusal_count_guard();
