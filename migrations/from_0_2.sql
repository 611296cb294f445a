-- The rows of an evq 0.2.0 database, copied into the 1.0 baseline (migrations/from_0_2.py runs
-- this). When it runs, 0.2's tables are in schema evq_0_2 (moved there whole, with their
-- sequences) and the baseline's are in evq's schema, empty but for the pepper's row; it is all
-- one transaction. One block per table, in an order the foreign keys accept; a block's row count
-- is reported under its name. Each block names every column it writes: a column 1.0 added gets
-- its default (0.2 had no approvals, scheduling, priority, redaction, provenance or callbacks).
--
-- When the baseline's tables change (before the release, in place), change the blocks here to
-- match: tests/integration/test_upgrade_from_0_2.py fills a 0.2 database in every state and
-- checks where each row arrives.

-- name: decisions
-- Who asked is not known: 0.2 kept no key name (actor, actor_key_id and interface stay NULL,
-- as for a Python API enqueue that named no actor).
INSERT INTO decisions (id, run_id, step_id, intent, instruction_version, prompt_version, model, tool, rationale,
                       decided_at, created_at)
SELECT id, run_id, step_id, intent, instruction_version, prompt_version, model, tool, rationale, decided_at,
       created_at
FROM evq_0_2.decisions;

-- name: email_steps
-- Every state as it was: a pending step is claimed by the next worker; an in-flight one keeps
-- its lease (in the queue, below), so the rescuer finds it when the lease expires and makes it
-- unknown (the 0.2 worker that held it may have sent it); retryable, unknown and closed steps
-- keep their attempts, deadlines, dedupe window and maybe_delivered. 1.0 keeps an attempt under
-- way on the queue row only: an in-flight step's row here says what it was claimed from
-- (pending for a first attempt, else retryable) with the counters it had before that attempt.
INSERT INTO email_steps (id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
                         payload_sha256, status, reason, detail, attempts, max_attempts, next_attempt_at,
                         dedupe_until, maybe_delivered,
                         provider_message_id, notify, notice_of, reconcile_after, reconcile_checks, created_at,
                         updated_at, first_attempt_at, unknown_since, closed_at, uncharged_attempts, retry_from)
SELECT id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload, payload_sha256,
       CASE WHEN status <> 'in_flight' THEN status WHEN attempts > 1 THEN 'retryable' ELSE 'pending' END,
       reason, detail,
       CASE WHEN status = 'in_flight' THEN attempts - 1 ELSE attempts END, max_attempts, next_attempt_at,
       CASE WHEN status = 'in_flight' AND attempts = 1 THEN NULL ELSE dedupe_until END,
       CASE WHEN status = 'in_flight' AND attempts = 1 THEN false ELSE maybe_delivered END,
       provider_message_id, notify, notice_of, reconcile_after, reconcile_checks,
       created_at, updated_at,
       CASE WHEN status = 'in_flight' AND attempts = 1 THEN NULL ELSE first_attempt_at END,
       unknown_since, closed_at, least(uncharged_attempts, CASE WHEN status = 'in_flight' THEN attempts - 1
                                                               ELSE attempts END), retry_from
FROM evq_0_2.email_steps;

-- name: step_queue
-- The queue: every step owed a send (pending, retryable) and every one under an attempt (in
-- flight, with its lease and the attempt's counters).
INSERT INTO step_queue (id, provider, next_attempt_at, attempts, first_attempt_at, dedupe_until, maybe_delivered,
                        lease_owner, lease_token, lease_expires_at, updated_at)
SELECT id, provider, next_attempt_at, attempts, first_attempt_at, dedupe_until, maybe_delivered,
       lease_owner, lease_token, lease_expires_at, updated_at
FROM evq_0_2.email_steps
WHERE status IN ('pending', 'retryable', 'in_flight');

-- name: key_ledger
-- Derived: the key ledger (invariant 12) holds every key a step of this database holds, as
-- its enqueue would have written it. 0.2 had no ledger: the keys of steps evq prune removed
-- under 0.2 are gone with them, and nothing here can bring them back (from_0_2.py counts them
-- from prune_log and says so).
INSERT INTO step_keys (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256, created_at)
SELECT idempotency_key, id, run_id, step_id, message_id, provider, decode(payload_sha256, 'hex'), created_at
FROM evq_0_2.email_steps;

-- name: sequences
-- Each id carries on from where 0.2 left it (the last id handed out, committed or not), before
-- any evidence partition is made for the step ids.
SELECT setval(pg_get_serial_sequence('decisions', 'id'), s.last_value, s.is_called)
FROM evq_0_2.decisions_id_seq s
UNION ALL
SELECT setval(pg_get_serial_sequence('email_steps', 'id'), s.last_value, s.is_called)
FROM evq_0_2.email_steps_id_seq s
UNION ALL
SELECT setval(pg_get_serial_sequence('evidence', 'id'), s.last_value, s.is_called)
FROM evq_0_2.evidence_id_seq s
UNION ALL
SELECT setval(pg_get_serial_sequence('api_keys', 'id'), s.last_value, s.is_called)
FROM evq_0_2.api_keys_id_seq s
UNION ALL
SELECT setval(pg_get_serial_sequence('prune_log', 'id'), s.last_value, s.is_called)
FROM evq_0_2.prune_log_id_seq s
UNION ALL
SELECT setval(pg_get_serial_sequence('provider_circuit_events', 'id'), s.last_value, s.is_called)
FROM evq_0_2.provider_circuit_events_id_seq s;

-- name: evidence_partitions
-- Partitions up to the copied step ids and four ahead, so the history lands in partitions of
-- the default size that retention can drop one by one, not in the overflow.
SELECT evq_evidence_partitions_ahead(1000000);

-- name: evidence
-- Every row as it was, each in its step's partition. The rows are not new events: the trigger
-- that turns an evidence row into its key's event (key_events.sql) is off while they are copied
-- (a key's feed starts at the upgrade, and 0.2's steps name no key).
ALTER TABLE evidence DISABLE TRIGGER evidence_key_events;
INSERT INTO evidence (id, step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
                      provider_message_id, lease_token, latency_ms, detail, created_at)
SELECT id, step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason, provider_message_id,
       lease_token, latency_ms, detail, created_at
FROM evq_0_2.evidence;
ALTER TABLE evidence ENABLE TRIGGER evidence_key_events;

-- name: api_keys
-- Their HMACs (and any scrypt hash made before 0.2, rehashed at first use) are checked against
-- 0.2's pepper, kept below: every key authenticates as before.
-- 0.2 had no per-key approval: an agent key's sends now wait for a person (fail closed: the agent
-- harness rule), an operator's or admin's keep the installation's policy, as every send had.
INSERT INTO api_keys (id, name, role, key_id, secret_hash, created_at, created_by, revoked_at, revoked_by,
                      session_generation, approval)
SELECT id, name, role, key_id, secret_hash, created_at, created_by, revoked_at, revoked_by, session_generation,
       CASE WHEN role = 'agent' THEN 'always' ELSE 'policy' END
FROM evq_0_2.api_keys;

-- name: api_key_pepper
-- 0.2's pepper, not the baseline's new one. Every step 0.2 enqueued may have reached an HTTP
-- provider under its key as it was (0.2 sent no keyed wire key), so each keeps that form for
-- every later attempt: wire_keys_from is the first step id 0.2 never handed out.
UPDATE api_key_pepper p
SET pepper = o.pepper, created_at = o.created_at,
    wire_keys_from = coalesce(pg_sequence_last_value('evq_0_2.email_steps_id_seq'::regclass) + 1, 1)
FROM evq_0_2.api_key_pepper o
WHERE p.id = 1 AND o.id = 1;

-- name: prune_log
INSERT INTO prune_log (id, run, batch, actor, cutoff, steps, evidence, decisions, first_step_id, last_step_id,
                       created_at)
SELECT id, run, batch, actor, cutoff, steps, evidence, decisions, first_step_id, last_step_id, created_at
FROM evq_0_2.prune_log;

-- name: provider_rate_limits
INSERT INTO provider_rate_limits (provider, tokens, refilled_at, paused_until)
SELECT provider, tokens, refilled_at, paused_until
FROM evq_0_2.provider_rate_limits;

-- name: provider_circuits
INSERT INTO provider_circuits (provider, state, reason, detail, opened_at, probe_at, probes, probe_owner,
                               probe_expires_at, updated_at)
SELECT provider, state, reason, detail, opened_at, probe_at, probes, probe_owner, probe_expires_at, updated_at
FROM evq_0_2.provider_circuits;

-- name: provider_circuit_events
INSERT INTO provider_circuit_events (id, provider, from_state, to_state, reason, detail, actor, probe_in, created_at)
SELECT id, provider, from_state, to_state, reason, detail, actor, probe_in, created_at
FROM evq_0_2.provider_circuit_events;
