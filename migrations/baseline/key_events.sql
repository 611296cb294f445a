-- Each key's feed of what became of its sends (docs/design.md, "Failure notices"): one event per
-- evidence row that moves an agent's step to rejected or unknown, or records an operator's
-- verdict. A trigger on evidence writes it, so no path that closes a step (record, late answer,
-- rescue, reconciler, verdict, webhook) can leave its event out, whatever notices are
-- configured. Notices are evq's own steps, not an agent's: left out. The evidence row is the one
-- the same statement wrote, so its step and decision exist. A key with a callback URL is owed a
-- delivery of the event, written in the same transaction (durable before the POST is tried).
CREATE FUNCTION evq_key_event() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    WITH ev AS (
        INSERT INTO key_events (key_id, kind, step, run_id, step_id, status, reason, detail, actor, evidence_id,
                                created_at)
        SELECT d.actor_key_id,
               CASE WHEN NEW.kind = 'operator_resolved' THEN 'verdict' ELSE NEW.to_status END,
               s.id, s.run_id, s.step_id, NEW.to_status, NEW.reason,
               left(coalesce(NEW.detail ->> 'message', NEW.detail ->> 'note'), 1000), NEW.actor, NEW.id,
               NEW.created_at
        FROM email_steps s
        JOIN decisions d ON d.id = s.decision_id
        WHERE s.id = NEW.step_id AND s.notice_of IS NULL
        RETURNING id, key_id, created_at
    )
    INSERT INTO callback_deliveries (event_id, key_id, next_attempt_at, created_at, updated_at)
    SELECT ev.id, ev.key_id, ev.created_at, ev.created_at, ev.created_at
    FROM ev JOIN api_keys k ON k.key_id = ev.key_id
    WHERE k.notify_url IS NOT NULL;
    RETURN NULL;
END
$$;

CREATE TRIGGER evidence_key_events AFTER INSERT ON evidence
    FOR EACH ROW WHEN ((NEW.to_status IN ('rejected', 'unknown') AND NEW.from_status IS DISTINCT FROM NEW.to_status)
                       OR NEW.kind = 'operator_resolved')
    EXECUTE FUNCTION evq_key_event();
