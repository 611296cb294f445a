-- A step as it is now: its email_steps row, with the attempt under way when step_queue holds
-- a lease for it (in_flight, the attempt's counters and its lease). email_steps keeps the
-- state a step was claimed from until the attempt's answer is written (the claim writes only
-- the narrow queue row: docs/design.md, "The queue"); every reader that shows a step reads it
-- here, with the columns, names and order email_steps had when it held the lease itself.
CREATE VIEW steps_now AS
SELECT s.id, s.run_id, s.step_id, s.decision_id, s.idempotency_key, s.message_id, s.provider, s.payload,
       s.payload_sha256,
       CASE WHEN q.lease_token IS NULL THEN s.status ELSE 'in_flight' END AS status,
       s.reason, s.detail,
       coalesce(q.attempts, s.attempts) AS attempts,
       s.max_attempts,
       coalesce(q.next_attempt_at, s.next_attempt_at) AS next_attempt_at,
       q.lease_owner, q.lease_token, q.lease_expires_at,
       CASE WHEN q.id IS NULL THEN s.dedupe_until ELSE q.dedupe_until END AS dedupe_until,
       coalesce(q.maybe_delivered, s.maybe_delivered) AS maybe_delivered,
       s.provider_message_id, s.notify, s.notice_of, s.reconcile_after, s.reconcile_checks, s.created_at,
       CASE WHEN q.lease_token IS NULL THEN s.updated_at ELSE q.updated_at END AS updated_at,
       CASE WHEN q.id IS NULL THEN s.first_attempt_at ELSE q.first_attempt_at END AS first_attempt_at,
       s.unknown_since, s.closed_at, s.uncharged_attempts, s.retry_from, s.content_redacted_at, s.priority,
       s.send_at, s.held_since, s.hold_expires_at, s.hold, s.requested_sha256
FROM email_steps s
LEFT JOIN step_queue q ON q.id = s.id;
