-- Retention (docs/design.md, "Retention"): the only paths that remove history or a message
-- body. Each is a SECURITY DEFINER function owned by the owner role, so the runtime role (which
-- may not delete a step, nor update or delete history) can run exactly this and nothing more;
-- a definer function is callable by PUBLIC unless revoked, so EXECUTE is the runtime role's
-- only (roles.sql grants it). The database's clock decides what is old.

-- Which steps a prune with cutoff p_cutoff removes. A step may go when it is terminal, was
-- created and closed before the cutoff, and every failure notice that points at it (notice_of)
-- may go too; a notice goes with its original when the original may go (same batch), alone when
-- the original stays. A notice never has a notice of its own (ck_email_steps_notice_never_notifies),
-- so one level is the whole story. A batch is counted in roots: the steps that are not a notice
-- of an original that also goes (those ride along with their original). evq_prune_count and
-- evq_prune_batch share this predicate word for word, so the dry run counts exactly what the
-- real run deletes.
CREATE FUNCTION evq_prune_count(p_cutoff timestamptz)
RETURNS TABLE (pruned_steps bigint, pruned_evidence bigint, pruned_decisions bigint)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    WITH roots AS (
        SELECT s.id, s.decision_id FROM email_steps s
        WHERE s.status IN ('accepted', 'rejected') AND s.created_at < p_cutoff AND s.closed_at < p_cutoff
          AND NOT EXISTS (
              SELECT 1 FROM email_steps n
              WHERE n.notice_of = s.id
                AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff AND n.closed_at < p_cutoff))
          AND NOT (s.notice_of IS NOT NULL AND EXISTS (
              SELECT 1 FROM email_steps o
              WHERE o.id = s.notice_of
                AND o.status IN ('accepted', 'rejected') AND o.created_at < p_cutoff AND o.closed_at < p_cutoff
                AND NOT EXISTS (
                    SELECT 1 FROM email_steps n
                    WHERE n.notice_of = o.id
                      AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff
                               AND n.closed_at < p_cutoff))))
    ), doomed AS (
        SELECT id, decision_id FROM roots
        UNION ALL
        SELECT n.id, n.decision_id FROM email_steps n JOIN roots r ON n.notice_of = r.id
    )
    SELECT (SELECT count(*) FROM doomed),
           (SELECT count(*) FROM evidence e JOIN doomed d ON d.id = e.step_id),
           (SELECT count(DISTINCT decision_id) FROM doomed)
$$;

-- One batch of evq prune, in one statement: the steps (with their notices), their evidence and
-- decisions, what answers a repeat of each key (the key ledger, invariant 12), and the batch's
-- prune_log row. Never a step a notice still points at: an original waits until each of its
-- notices may go too, and goes in the same batch as them.
CREATE FUNCTION evq_prune_batch(p_cutoff timestamptz, p_limit integer, p_actor text, p_run uuid, p_batch integer)
RETURNS TABLE (pruned_steps integer, pruned_evidence integer, pruned_decisions integer)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    -- A cutoff past the database's now() comes from a client whose clock runs ahead, and would
    -- remove history closed moments ago.
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
        WHERE s.status IN ('accepted', 'rejected') AND s.created_at < p_cutoff AND s.closed_at < p_cutoff
          AND NOT EXISTS (
              SELECT 1 FROM email_steps n
              WHERE n.notice_of = s.id
                AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff AND n.closed_at < p_cutoff))
          AND NOT (s.notice_of IS NOT NULL AND EXISTS (
              SELECT 1 FROM email_steps o
              WHERE o.id = s.notice_of
                AND o.status IN ('accepted', 'rejected') AND o.created_at < p_cutoff AND o.closed_at < p_cutoff
                AND NOT EXISTS (
                    SELECT 1 FROM email_steps n
                    WHERE n.notice_of = o.id
                      AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff
                               AND n.closed_at < p_cutoff))))
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
        RETURNING s.id, s.decision_id, s.idempotency_key, s.run_id, s.step_id, s.message_id, s.provider,
                  s.payload_sha256, s.requested_sha256, s.created_at, s.status, s.reason, s.maybe_delivered,
                  s.closed_at
    ), kept AS (
        -- The key ledger keeps what answers a repeat of each key (invariant 12), written in this
        -- statement: never a moment with the step gone and its end unrecorded. An upsert on the
        -- key, the point every enqueue of it meets: a step with no ledger row yet is recorded
        -- now. The ledger holds the agent's own digest; an approver's correction goes in
        -- corrected_sha256.
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

REVOKE ALL ON FUNCTION evq_prune_batch(timestamptz, integer, text, uuid, integer) FROM PUBLIC;

-- Content retention (EVQ_KEEP_CONTENT): the body parts (text, html) of steps closed more than
-- p_keep ago become null, and payload.content_redacted records each part's size in UTF-8 bytes
-- and its SHA-256, computed here from the original (a part that was null is recorded as null).
-- Headers, recipients, subject, Message-ID, key and payload_sha256 stay, so the original request
-- still proves against the stored hash. Each step gets a content_redacted evidence row in the
-- same statement. It can do nothing else: no open step, no step closed within p_keep, no other
-- column, a step once only (guards.sql keeps every other role from marking one).
CREATE FUNCTION evq_redact_batch(p_keep interval, p_limit integer, p_actor text)
RETURNS TABLE (redacted integer, first_step_id bigint, last_step_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    -- Only forward: a negative keep would reach steps that close in the future, i.e. open ones.
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
        SET payload = s.payload || jsonb_build_object('text', NULL, 'html', NULL)
                      || jsonb_build_object('content_redacted', jsonb_build_object(
                             'at', now(),
                             'parts', jsonb_build_object(
                                 'text', CASE WHEN s.payload ->> 'text' IS NULL THEN NULL ELSE jsonb_build_object(
                                     'bytes', octet_length(convert_to(s.payload ->> 'text', 'UTF8')),
                                     'sha256', encode(sha256(convert_to(s.payload ->> 'text', 'UTF8')), 'hex')) END,
                                 'html', CASE WHEN s.payload ->> 'html' IS NULL THEN NULL ELSE jsonb_build_object(
                                     'bytes', octet_length(convert_to(s.payload ->> 'html', 'UTF8')),
                                     'sha256', encode(sha256(convert_to(s.payload ->> 'html', 'UTF8')), 'hex')) END))),
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
$$;

REVOKE ALL ON FUNCTION evq_redact_batch(interval, integer, text) FROM PUBLIC;
