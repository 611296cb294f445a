-- What a step is, and that a closed step stays closed, held in the database (invariant 11;
-- docs/design.md, "Database roles"). The runtime role must UPDATE email_steps (every
-- transition is an UPDATE), so its privileges cannot keep it from rewriting a step's request
-- or putting an accepted step back to pending. These triggers refuse that to every role that
-- cannot act as the table's owner (the owner could disable them anyway; tests and repairs run
-- as it, as with the prune switch).
--
-- Each trigger's WHEN condition is evaluated in C before the function is called, and is true
-- for every update the function could refuse (its refusals' conditions, joined by OR): a claim
-- or a recorded answer never pays for a PL/pgSQL call (about 30 us of the server's time per
-- row each). When the condition holds, the function decides (the owner's bypass, an
-- approver's correction of a held request).

-- Fixed at enqueue: the ids, key, Message-ID, provider, notify and created_at, never changed;
-- the payload and its hash only by an approver's correction as a held send is approved, with
-- the agent's own hash kept in requested_sha256. A send is held only at enqueue. An accepted
-- step stays accepted; a rejected one, but for the operator's dead-letter requeue (to
-- retryable, only after temporary failures: nothing possibly delivered).
CREATE FUNCTION evq_step_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        RETURN NEW;
    END IF;
    IF NEW.id IS DISTINCT FROM OLD.id OR NEW.run_id IS DISTINCT FROM OLD.run_id
       OR NEW.step_id IS DISTINCT FROM OLD.step_id OR NEW.decision_id IS DISTINCT FROM OLD.decision_id
       OR NEW.idempotency_key IS DISTINCT FROM OLD.idempotency_key OR NEW.message_id IS DISTINCT FROM OLD.message_id
       OR NEW.provider IS DISTINCT FROM OLD.provider OR NEW.notify IS DISTINCT FROM OLD.notify
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'evq: step %: what a step is (its request, ids and key) is fixed at enqueue', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    -- An approver's correction: only as the held step is approved, with the agent's own hash kept.
    IF (NEW.payload IS DISTINCT FROM OLD.payload OR NEW.payload_sha256 IS DISTINCT FROM OLD.payload_sha256
        OR NEW.requested_sha256 IS DISTINCT FROM OLD.requested_sha256)
       AND NOT (OLD.status = 'held' AND NEW.status = 'pending'
                AND NEW.requested_sha256 IS NOT DISTINCT FROM coalesce(OLD.requested_sha256, OLD.payload_sha256)) THEN
        RAISE EXCEPTION 'evq: step %: a request is corrected only as its held send is approved', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = 'held' AND OLD.status <> 'held' THEN
        RAISE EXCEPTION 'evq: step %: a send is held only at enqueue', OLD.id USING ERRCODE = 'check_violation';
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

CREATE TRIGGER email_steps_guard BEFORE UPDATE ON email_steps
    FOR EACH ROW WHEN ((OLD.id, OLD.run_id, OLD.step_id, OLD.decision_id, OLD.idempotency_key, OLD.message_id,
                        OLD.provider, OLD.notify, OLD.created_at, OLD.payload, OLD.payload_sha256,
                        OLD.requested_sha256)
                       IS DISTINCT FROM
                       (NEW.id, NEW.run_id, NEW.step_id, NEW.decision_id, NEW.idempotency_key, NEW.message_id,
                        NEW.provider, NEW.notify, NEW.created_at, NEW.payload, NEW.payload_sha256,
                        NEW.requested_sha256)
                       OR (NEW.status = 'held' AND OLD.status <> 'held')
                       OR (OLD.status IN ('accepted', 'rejected') AND NEW.status <> OLD.status))
    EXECUTE FUNCTION evq_step_guard();

-- Content retention (prune.sql's evq_redact_batch, running as the owner) is the only way a
-- step is marked redacted, and a redacted step stays closed: its body is gone, so nothing may
-- send it again.
CREATE FUNCTION evq_content_guard() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
$$;

CREATE TRIGGER email_steps_content_guard BEFORE UPDATE ON email_steps
    FOR EACH ROW WHEN (NEW.content_redacted_at IS DISTINCT FROM OLD.content_redacted_at
                       OR (OLD.content_redacted_at IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status))
    EXECUTE FUNCTION evq_content_guard();
