-- Every runtime statement evq runs, one named block each (`-- name: noun_verb`),
-- loaded by adapters/postgres/queries.py. Transitions are guarded by the state
-- (and the lease) they expect; zero rows back means a race was lost, never an error.
-- Every statement takes %(now)s: NULL means the database clock, which is the one
-- clock all workers on all hosts share; tests pass a fixed time.


-- name: step_enqueue
-- The key ledger, decision and step in one statement. The ledger first (step_keys): its
-- primary key is where every enqueue of a key meets every other and evq prune (invariant 12), so
-- a key it holds, a step's or a pruned step's, never gets a step again. It is skipped when a step
-- already holds the key or the run and step ids (as this statement's snapshot sees them: the
-- same request is then answered as its row is, a different one refused); the step is written
-- only when the ledger row was, and then nothing else can hold its key (a step's ledger row
-- goes in with it) or, but for a concurrent enqueue of the same ids under another key, its
-- ids: that one meets uq_email_steps_run_id_step_id here and is refused (IdempotencyConflict).
-- The decision is written only if the step was, so a repeated enqueue leaves no orphan
-- decision. Both ids are drawn from their sequences when the ledger's insert is tried (a repeat
-- its snapshot answers draws none, a pruned key's both); the foreign key is checked at the end of
-- the statement. The sequences are named (the columns' defaults), not looked up:
-- pg_get_serial_sequence() reads pg_depend on every call, and in the batch statement on every row.
-- A step the approval policy holds (worker/approval_policy.py, %(held)s) is written `held`, reason
-- approval_required, with its reasons (%(hold)s) and when it expires; its `held` evidence is
-- step_held_evidence, in the same transaction. `send_at` starts next_attempt_at and the retry
-- budget (retry_from) later; a past one is now. Nothing wakes a worker for a held step.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), ids AS (
    SELECT nextval('decisions_id_seq'::regclass) AS decision_id, nextval('email_steps_id_seq'::regclass) AS id
), k AS (
    INSERT INTO step_keys (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256, created_at)
    SELECT %(idempotency_key)s, ids.id, %(run_id)s, %(step_id)s, %(message_id)s, %(provider)s,
           decode(%(payload_sha256)s, 'hex'), t.now
    FROM ids, t
    WHERE NOT EXISTS (SELECT 1 FROM email_steps s WHERE s.idempotency_key = %(idempotency_key)s)
      AND NOT EXISTS (SELECT 1 FROM email_steps s WHERE s.run_id = %(run_id)s AND s.step_id = %(step_id)s)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), step AS (
    INSERT INTO email_steps (
        id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
        payload_sha256, max_attempts, notify, next_attempt_at, created_at, updated_at,
        status, reason, held_since, hold_expires_at, hold, priority, send_at, retry_from
    )
    SELECT k.id, %(run_id)s, %(step_id)s, ids.decision_id, %(idempotency_key)s, %(message_id)s, %(provider)s,
           %(payload)s::jsonb, %(payload_sha256)s, %(max_attempts)s, %(notify)s,
           greatest(t.now, %(send_at)s::timestamptz), t.now, t.now,
           CASE WHEN %(held)s::bool THEN 'held' ELSE 'pending' END,
           CASE WHEN %(held)s::bool THEN 'approval_required' END,
           CASE WHEN %(held)s::bool THEN t.now END,
           CASE WHEN %(held)s::bool THEN t.now + make_interval(secs => %(hold_expires_seconds)s::float8) END,
           %(hold)s::jsonb, %(priority)s, %(send_at)s::timestamptz,
           CASE WHEN %(send_at)s::timestamptz > t.now THEN %(send_at)s::timestamptz END
    FROM k, ids, t
    RETURNING id, run_id, step_id, idempotency_key, message_id, status, payload_sha256, decision_id, provider,
              created_at, hold, requested_sha256, hold_expires_at, priority, next_attempt_at
), queued AS (
    -- Owed a send: its queue row (a held step gets one when it is approved).
    INSERT INTO step_queue (id, provider, priority, next_attempt_at)
    SELECT step.id, step.provider, step.priority, step.next_attempt_at
    FROM step
    WHERE step.status <> 'held'
), decision AS (
    INSERT INTO decisions (
        id, run_id, step_id, intent, instruction_version, prompt_version, model, tool,
        rationale, decided_at, created_at, actor, actor_key_id, interface
    )
    SELECT step.decision_id, %(run_id)s, %(step_id)s, %(intent)s, %(instruction_version)s, %(prompt_version)s,
           %(model)s, %(tool)s, %(rationale)s::jsonb, %(decided_at)s, t.now, %(actor)s, %(actor_key_id)s,
           %(interface)s
    FROM step, t
    RETURNING id
)
SELECT step.id, step.run_id, step.step_id, step.idempotency_key, step.message_id, step.status,
       step.payload_sha256, step.provider, step.created_at, step.hold, true AS created, step.requested_sha256,
       NULL::text AS reason, false AS maybe_delivered, false AS pruned, step.hold_expires_at
FROM step
LEFT JOIN LATERAL (SELECT pg_notify('evq_steps', step.provider) WHERE step.status <> 'held') AS wake ON true
UNION ALL
-- requested_sha256: the agent's own hash of a step an approver corrected, which a
-- retry of the agent's request still matches (worker/enqueue.py, existing_or_conflict).
SELECT s.id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.status, s.payload_sha256, s.provider,
       s.created_at, s.hold, false, s.requested_sha256, s.reason, s.maybe_delivered, false, s.hold_expires_at
FROM steps_now s
WHERE s.idempotency_key = %(idempotency_key)s AND NOT EXISTS (SELECT 1 FROM step)
UNION ALL
-- A pruned step's key: answered as the step ended (step_get_by_key's second part).
SELECT p.id, p.run_id, p.step_id, p.idempotency_key, p.message_id, p.status,
       encode(coalesce(p.corrected_sha256, p.payload_sha256), 'hex'), p.provider, p.created_at, NULL::jsonb, false,
       CASE WHEN p.corrected_sha256 IS NOT NULL THEN encode(p.payload_sha256, 'hex') END, p.reason,
       coalesce(p.maybe_delivered, false), true, NULL::timestamptz
FROM step_keys p
WHERE p.idempotency_key = %(idempotency_key)s AND p.pruned_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM step);


-- name: step_enqueue_many
-- Many ledger rows, decisions and steps in one statement (batch enqueue), the same rules as
-- step_enqueue: the key ledger first (ON CONFLICT on its key: a key it holds gets no step), one
-- request per run and step ids (the first; a second under another key would meet
-- uq_email_steps_run_id_step_id), then a step for each ledger row written and a decision for
-- each step, one notification per provider. The reads of email_steps see the statement's
-- snapshot, so they find rows that held a key before this statement; a request that neither
-- wrote nor found its key (a duplicate inside the batch, taken run_id/step_id, a concurrent
-- insert) comes back with both ids NULL and the caller settles it with step_enqueue, which
-- sees everything the transaction wrote.
-- Rows come back unordered, named by `ord`; a created row returns only its id
-- (the caller holds everything else it wrote).
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), r AS (
    -- One JSON array of positional arrays, one per request, the payload last as
    -- the canonical JSON the caller already has: one document to encode and parse,
    -- without nineteen typed arrays (whose per-element encoding cost more than the
    -- inserts) or a key name repeated in every row. `->>` on a JSON null is NULL.
    -- Step ids are drawn here, in request order, so the claim (next_attempt_at, id) takes a
    -- batch first in, first out.
    SELECT e.ord, e.v->>0 AS run_id, e.v->>1 AS step_id, e.v->>2 AS idempotency_key, e.v->>3 AS message_id,
           e.v->>4 AS provider, e.v->>5 AS payload_sha256, (e.v->>6)::int AS max_attempts, e.v->>7 AS notify,
           e.v->>8 AS intent, e.v->>9 AS instruction_version, e.v->>10 AS prompt_version, e.v->>11 AS model,
           e.v->>12 AS tool, nullif(e.v->13, 'null'::jsonb) AS rationale, (e.v->>14)::timestamptz AS decided_at,
           e.v->>15 AS actor, e.v->>16 AS actor_key_id, e.v->>17 AS interface,
           (e.v->>18)::smallint AS priority, (e.v->>19)::timestamptz AS send_at,
           e.v->20 AS payload, nextval('decisions_id_seq'::regclass) AS decision_id,
           nextval('email_steps_id_seq'::regclass) AS id
    FROM jsonb_array_elements(%(requests)s::jsonb) WITH ORDINALITY AS e(v, ord)
), fresh AS (
    SELECT DISTINCT ON (r.run_id, r.step_id) r.*
    FROM r
    WHERE NOT EXISTS (SELECT 1 FROM email_steps s WHERE s.idempotency_key = r.idempotency_key)
      AND NOT EXISTS (SELECT 1 FROM email_steps s WHERE s.run_id = r.run_id AND s.step_id = r.step_id)
    ORDER BY r.run_id, r.step_id, r.ord
), k AS (
    INSERT INTO step_keys (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256, created_at)
    SELECT f.idempotency_key, f.id, f.run_id, f.step_id, f.message_id, f.provider, decode(f.payload_sha256, 'hex'),
           t.now
    FROM fresh f, t
    -- In request order: of two requests with one key, the first is written.
    ORDER BY f.ord
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), step AS (
    INSERT INTO email_steps (
        id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
        payload_sha256, max_attempts, notify, next_attempt_at, created_at, updated_at, priority, send_at,
        retry_from
    )
    SELECT r.id, r.run_id, r.step_id, r.decision_id, r.idempotency_key, r.message_id, r.provider, r.payload,
           r.payload_sha256, r.max_attempts, r.notify, greatest(t.now, r.send_at), t.now, t.now,
           r.priority, r.send_at, CASE WHEN r.send_at > t.now THEN r.send_at END
    FROM r JOIN k ON k.id = r.id, t
    RETURNING id, decision_id, provider, priority, next_attempt_at
), queued AS (
    INSERT INTO step_queue (id, provider, priority, next_attempt_at)
    SELECT id, provider, priority, next_attempt_at FROM step
), decision AS (
    INSERT INTO decisions (
        id, run_id, step_id, intent, instruction_version, prompt_version, model, tool,
        rationale, decided_at, created_at, actor, actor_key_id, interface
    )
    SELECT r.decision_id, r.run_id, r.step_id, r.intent, r.instruction_version, r.prompt_version, r.model, r.tool,
           r.rationale, r.decided_at, t.now, r.actor, r.actor_key_id, r.interface
    FROM step JOIN r ON r.decision_id = step.decision_id, t
), wake AS (
    SELECT pg_notify('evq_steps', p.provider) FROM (SELECT DISTINCT provider FROM step) AS p
)
SELECT r.ord, step.id, s.id AS existing_id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.status,
       s.reason, s.maybe_delivered, s.payload_sha256, s.provider, s.hold, s.requested_sha256, s.pruned, s.hold_expires_at,
       (SELECT count(*) FROM wake) AS woke
FROM r
LEFT JOIN step ON step.id = r.id
-- Lateral with LIMIT (which keeps the planner from flattening it), so `step.id IS
-- NULL` is a one-time filter in front of the index probes: a created row costs no lookup.
-- The step holding the key, else the ledger's pruned one (as step_get_by_key).
LEFT JOIN LATERAL (
    SELECT s.id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.status, s.reason, s.maybe_delivered,
           s.payload_sha256, s.provider, s.hold, s.requested_sha256, false AS pruned, s.hold_expires_at
    FROM steps_now s WHERE step.id IS NULL AND s.idempotency_key = r.idempotency_key
    UNION ALL
    SELECT p.id, p.run_id, p.step_id, p.idempotency_key, p.message_id, p.status, p.reason,
           coalesce(p.maybe_delivered, false), encode(coalesce(p.corrected_sha256, p.payload_sha256), 'hex'),
           p.provider, NULL::jsonb, CASE WHEN p.corrected_sha256 IS NOT NULL THEN encode(p.payload_sha256, 'hex') END,
           true, NULL::timestamptz
    FROM step_keys p WHERE step.id IS NULL AND p.idempotency_key = r.idempotency_key AND p.pruned_at IS NOT NULL
    LIMIT 1
) s ON true;


-- name: step_get_by_key
-- The row holding the request's key, else its run and step ids; a key whose step evq prune
-- removed is answered from the key ledger (step_keys) as the step ended (`pruned`): the
-- digest it was sent with (corrected_sha256, when an approver corrected it) and the agent's own.
SELECT * FROM (
    SELECT id, run_id, step_id, idempotency_key, message_id, status, reason, maybe_delivered, payload_sha256,
           provider, created_at, hold, false AS created, requested_sha256, false AS pruned, hold_expires_at
    FROM steps_now
    WHERE idempotency_key = %(idempotency_key)s OR (run_id = %(run_id)s AND step_id = %(step_id)s)
    UNION ALL
    SELECT id, run_id, step_id, idempotency_key, message_id, status, reason, coalesce(maybe_delivered, false),
           encode(coalesce(corrected_sha256, payload_sha256), 'hex'), provider, created_at, NULL::jsonb, false,
           CASE WHEN corrected_sha256 IS NOT NULL THEN encode(payload_sha256, 'hex') END, true, NULL::timestamptz
    FROM step_keys
    WHERE idempotency_key = %(idempotency_key)s AND pruned_at IS NOT NULL
) AS held
ORDER BY (held.idempotency_key = %(idempotency_key)s) DESC
LIMIT 1;


-- name: step_pruned
-- What the key ledger keeps of a step evq prune removed, by its id (`evq steps show`).
SELECT id, run_id, step_id, idempotency_key, message_id, provider, status, reason, closed_at, pruned_at
FROM step_keys
WHERE id = %(id)s AND pruned_at IS NOT NULL;


-- name: approval_context
-- What the approval policy reads before a new step is written (worker/approval_policy.py): the
-- enqueue's clock, and which of the recipients' contact keys this sender is known for.
SELECT coalesce(%(now)s::timestamptz, now()) AS now,
       coalesce((SELECT array_agg(k.recipient ORDER BY k.recipient) FROM known_recipients k
                 WHERE k.sender = %(sender)s AND k.recipient = ANY(%(keys)s::text[])), '{}') AS known;


-- name: budget_charge
-- Charge one blast-radius counter, under its row's lock, only while it stays within its cap:
-- the cap is in the statement's condition, so concurrent enqueues (each waiting on the row
-- lock, then re-reading the row) can never together pass it. No row back: it would pass.
-- Callers charge a send's counters in budget_charges' sorted order (no lock cycle).
INSERT INTO send_budgets AS b (budget, scope, window_start, used, updated_at)
SELECT %(budget)s, %(scope)s, %(window_start)s, %(amount)s, coalesce(%(now)s::timestamptz, now())
WHERE %(amount)s <= %(cap)s
ON CONFLICT (budget, scope, window_start)
DO UPDATE SET used = b.used + EXCLUDED.used, updated_at = EXCLUDED.updated_at
WHERE b.used + EXCLUDED.used <= %(cap)s
RETURNING b.used;


-- name: budget_lock
-- Take one counter's row lock (making the row, at 0, if it has none) without charging it: a
-- batch takes every counter it may charge first, in one sorted order, so two batches whose
-- requests charge the same counters in different orders never wait on each other in a cycle.
INSERT INTO send_budgets AS b (budget, scope, window_start, used, updated_at)
VALUES (%(budget)s, %(scope)s, %(window_start)s, 0, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (budget, scope, window_start) DO UPDATE SET used = b.used
RETURNING b.used;


-- name: budget_uncharge
-- Give back what budget_charge took, in the same transaction (its row still locked by it),
-- when a later counter of the same send would pass its cap: a held or refused send charges nothing.
UPDATE send_budgets SET used = used - %(amount)s
WHERE budget = %(budget)s AND scope = %(scope)s AND window_start = %(window_start)s;


-- name: budget_used
SELECT coalesce((SELECT used FROM send_budgets
                 WHERE budget = %(budget)s AND scope = %(scope)s AND window_start = %(window_start)s), 0) AS used;


-- name: budget_usage
-- `evq policy show`: the counters of the current windows (a run's budget has one, at the epoch).
SELECT budget, scope, window_start, used
FROM send_budgets
-- used 0: a counter a send charged and gave back (budget_uncharge), as good as none.
WHERE used > 0
  AND ((budget = 'run_recipients')
       OR (budget IN ('key_hourly', 'domain_hourly')
           AND window_start = date_trunc('hour', coalesce(%(now)s::timestamptz, now()), 'UTC'))
       OR (budget = 'key_daily' AND window_start = date_trunc('day', coalesce(%(now)s::timestamptz, now()), 'UTC')))
ORDER BY used DESC, budget, scope
LIMIT %(limit)s;


-- name: step_held_evidence
-- The `held` evidence of a step written held: who enqueued it and why it waits. No to_status:
-- the step was never in another state (an enqueue's evidence has no transition).
INSERT INTO evidence (step_id, run_id, kind, actor, reason, detail, created_at)
VALUES (%(id)s, %(run_id)s, 'held', %(actor)s, 'approval_required', %(detail)s::jsonb,
        coalesce(%(now)s::timestamptz, now()));


-- name: known_recipients_add
-- The first-contact rule's memory: a sender may mail these again without a hold.
INSERT INTO known_recipients (sender, recipient, first_step_id, created_at)
SELECT %(sender)s, k, %(step)s, coalesce(%(now)s::timestamptz, now())
FROM unnest(%(keys)s::text[]) AS k
ON CONFLICT DO NOTHING;


-- name: step_claim
-- One statement: pick claimable rows (SKIP LOCKED keeps concurrent workers apart),
-- start their attempt (attempts+1, a fresh lease token, the dedupe deadline counted
-- from the first attempt) and write the attempt_started evidence. When it commits, the
-- attempt is on record before any adapter is called (invariant 2).
-- Only the narrow queue row is written (step_queue: its lease and the attempt's counters);
-- email_steps is read for the request and keeps the state the step was claimed from until
-- the answer is written (step_record). A queue row whose step is not pending or retryable
-- there (a closed step: never claimed again, whatever wrote the row) is deleted unclaimed.
-- A row that may already have been delivered is only retried while the provider's
-- dedupe window still covers the whole lease; otherwise the rescuer makes it unknown.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), picked AS (
    SELECT q.id
    FROM step_queue q
    WHERE q.lease_token IS NULL
      AND q.next_attempt_at <= (SELECT now FROM t)
      AND q.provider = ANY(%(providers)s::text[])
      AND NOT (q.maybe_delivered AND coalesce(q.dedupe_until <= (SELECT now FROM t)
               + make_interval(secs => %(lease_seconds)s), true))
      -- A provider whose circuit is not closed gets nothing, but the probe the caller
      -- won (circuit_probe_take) for it (worker/circuit.py).
      AND (%(probe)s::bool OR NOT EXISTS (
          SELECT 1 FROM provider_circuits c WHERE c.provider = q.provider AND c.state <> 'closed'))
    -- Higher priority first (a verification code is not queued behind a newsletter), then
    -- oldest due: ix_step_queue_claimable's order.
    ORDER BY q.priority DESC, q.next_attempt_at, q.id
    LIMIT %(limit)s
    FOR UPDATE OF q SKIP LOCKED
), claimed AS (
    UPDATE step_queue q
    SET attempts = q.attempts + 1,
        lease_owner = %(owner)s,
        -- Derived from the worker's claim id, not random: a worker whose claim answer
        -- was lost knows exactly which tokens that claim could have given, so it hands
        -- back those rows only (step_orphan_claims), never one it may have sent.
        lease_token = md5(%(claim_id)s || ':' || q.id::text)::uuid,
        lease_expires_at = t.now + make_interval(secs => %(lease_seconds)s),
        first_attempt_at = coalesce(q.first_attempt_at, t.now),
        -- The provider counts its window from the first request it saw with our key,
        -- which is no earlier than our first attempt: counting from there is safe even
        -- if the first attempts never reached it. least() ignores NULL, so a window
        -- learnt only at a later attempt is still counted from the first, and a
        -- window that shrinks in the configuration shrinks here; it never grows.
        dedupe_until = least(
            q.dedupe_until,
            coalesce(q.first_attempt_at, t.now)
                + make_interval(secs => (%(dedupe_windows)s::jsonb ->> q.provider)::float8)
        ),
        updated_at = t.now
    FROM t, email_steps s
    -- By the primary key, whatever the queue's size (a join with `picked` may hash the whole queue).
    WHERE q.id = ANY(ARRAY(SELECT id FROM picked)) AND s.id = q.id AND s.status IN ('pending', 'retryable')
    RETURNING q.id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.provider, s.payload,
              q.attempts, s.max_attempts, q.lease_token, q.dedupe_until, q.maybe_delivered,
              s.created_at, s.uncharged_attempts, coalesce(s.retry_from, s.created_at) AS retry_from,
              s.status AS from_status, t.now AS claimed_at
), stray AS (
    -- A picked row whose step is not owed a send (no writer of evq leaves one) is deleted, not
    -- passed over: left, it would stay due and wake every claim for nothing.
    -- The picked rows `claimed` did not take (it already read each one's step): no second look-up.
    DELETE FROM step_queue q
    WHERE q.id = ANY(ARRAY(SELECT id FROM picked))
      AND NOT q.id = ANY(ARRAY(SELECT id FROM claimed))
), started AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, lease_token, created_at)
    SELECT c.id, c.run_id, c.attempts, 'attempt_started', %(owner)s, c.from_status, 'in_flight', c.lease_token,
           c.claimed_at
    FROM claimed c
)
-- In ClaimedStep's field order (worker/records.py): the store builds each from the row's
-- tuple as it is (adapters/postgres/store/queue.py checks these names against the fields).
SELECT id, run_id, step_id, idempotency_key, message_id, provider, payload, attempts, max_attempts,
       lease_token, %(lease_seconds)s::float8 AS lease_seconds,
       extract(epoch FROM dedupe_until - claimed_at)::float8 AS dedupe_remaining,
       maybe_delivered, created_at, uncharged_attempts,
       coalesce(extract(epoch FROM claimed_at - retry_from)::float8, 0) AS budget_age
FROM claimed
ORDER BY id;


-- name: step_record
-- The fenced completion (invariant 3): a row changes only if its queue row still holds
-- the lease this attempt was given. Outcomes of many sends are applied in one
-- statement (group commit); rows that do not match are handed to step_record_late.
-- The outcomes arrive as one JSON array of objects: one document to encode and
-- parse instead of a dozen typed arrays, which cost more than the update itself.
-- A step that leaves the queue (accepted, rejected, unknown) loses its queue row; a
-- retryable one keeps it, unleased, due after its backoff. Either way email_steps is
-- written once, with the state and the attempt's counters the queue row held.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), o AS (
    SELECT * FROM jsonb_to_recordset(%(transitions)s::jsonb) AS o(
        id bigint, lease_token uuid, attempt int, to_status text, reason text, outcome text,
        provider_message_id text, retry_delay float8, maybe_delivered bool, latency_ms float8, detail jsonb,
        message text, charged bool)
), dequeued AS (
    DELETE FROM step_queue q
    USING o
    -- The ids again as an array: the rows are found by the primary key, never a scan of the queue.
    WHERE q.id = ANY(ARRAY(SELECT o.id FROM o)) AND q.id = o.id AND q.lease_token = o.lease_token
      AND q.attempts = o.attempt AND o.to_status <> 'retryable'
    RETURNING q.id, q.attempts, q.first_attempt_at, q.dedupe_until
), requeued AS (
    UPDATE step_queue q
    SET lease_owner = NULL,
        lease_token = NULL,
        lease_expires_at = NULL,
        next_attempt_at = t.now + make_interval(secs => o.retry_delay),
        maybe_delivered = o.maybe_delivered,
        updated_at = t.now
    FROM o, t
    WHERE q.id = ANY(ARRAY(SELECT o.id FROM o)) AND q.id = o.id AND q.lease_token = o.lease_token
      AND q.attempts = o.attempt AND o.to_status = 'retryable'
    RETURNING q.id, q.attempts, q.first_attempt_at, q.dedupe_until
), leased AS (
    SELECT * FROM dequeued UNION ALL SELECT * FROM requeued
), applied AS (
    UPDATE email_steps s
    SET status = o.to_status,
        attempts = l.attempts,
        first_attempt_at = l.first_attempt_at,
        dedupe_until = l.dedupe_until,
        -- An attempt that hit a provider-level fault is not counted against the message.
        uncharged_attempts = s.uncharged_attempts + CASE WHEN o.charged THEN 0 ELSE 1 END,
        reason = o.reason,
        detail = o.message,
        provider_message_id = coalesce(o.provider_message_id, s.provider_message_id),
        maybe_delivered = o.maybe_delivered,
        next_attempt_at = CASE WHEN o.to_status = 'retryable'
                               THEN t.now + make_interval(secs => o.retry_delay)
                               ELSE s.next_attempt_at END,
        unknown_since = CASE WHEN o.to_status = 'unknown' THEN t.now END,
        closed_at = CASE WHEN o.to_status IN ('accepted', 'rejected') THEN t.now END,
        updated_at = t.now
    FROM leased l JOIN o ON o.id = l.id, t
    WHERE s.id = l.id AND s.status IN ('pending', 'retryable')
    RETURNING s.id, s.run_id
), answered AS (
    INSERT INTO evidence (
        step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
        provider_message_id, lease_token, latency_ms, detail, created_at
    )
    SELECT o.id, a.run_id, o.attempt, 'provider_response', %(actor)s, 'in_flight', o.to_status, o.outcome,
           o.reason, o.provider_message_id, o.lease_token, o.latency_ms, o.detail, t.now
    FROM o JOIN applied a ON a.id = o.id, t
)
-- One row: the ids that were not applied (usually none), not one row per outcome.
SELECT ARRAY(SELECT o.id FROM o WHERE NOT EXISTS (SELECT 1 FROM applied a WHERE a.id = o.id)) AS fenced;


-- name: step_record_late
-- Answers that lost their lease (a zombie worker, a commit retried after the
-- database came back). The answer is always kept as evidence; it changes the row
-- only when it is definite (its transition closes the step: accepted, or rejected
-- with no earlier attempt that may have been delivered), the row was left waiting
-- (unknown, or retryable after a rescue) and no later attempt has started: then
-- the answer is the best knowledge there is and closes the row. The unique index
-- on the lease token makes a repeated recording of the same answer a no-op.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), o AS (
    SELECT * FROM jsonb_to_recordset(%(transitions)s::jsonb) AS o(
        id bigint, lease_token uuid, attempt int, to_status text, reason text, outcome text,
        provider_message_id text, latency_ms float8, detail jsonb, message text)
), queued AS MATERIALIZED (
    -- The queue row first (every writer locks it before the step's row): a retryable step's,
    -- so no claim starts another attempt while this answer settles it.
    SELECT q.id, q.attempts, q.lease_token IS NOT NULL AS leased
    FROM step_queue q JOIN o ON o.id = q.id
    FOR UPDATE OF q
), cur AS (
    SELECT s.id, s.run_id, CASE WHEN q.leased THEN 'in_flight' ELSE s.status END AS status,
           coalesce(q.attempts, s.attempts) AS attempts,
           (o.to_status IN ('accepted', 'rejected')
            AND s.status IN ('unknown', 'retryable')
            AND NOT coalesce(q.leased, false)
            -- A retryable step has its queue row; one this statement did not see (and so could
            -- not lock) was put back after its snapshot (an operator's requeue, which FOR UPDATE
            -- reads as it left the row), and a worker may be sending it now: it has moved on.
            AND (s.status = 'unknown' OR q.id IS NOT NULL)
            AND coalesce(q.attempts, s.attempts) = o.attempt
            AND NOT EXISTS (SELECT 1 FROM evidence e
                            WHERE e.step_id = o.id AND e.lease_token = o.lease_token
                              AND e.kind IN ('provider_response', 'late_response'))) AS settles
    FROM email_steps s JOIN o ON o.id = s.id LEFT JOIN queued q ON q.id = s.id
    FOR UPDATE OF s
), late AS (
    INSERT INTO evidence (
        step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
        provider_message_id, lease_token, latency_ms, detail, created_at
    )
    SELECT o.id, cur.run_id, o.attempt, 'late_response', %(actor)s, cur.status,
           CASE WHEN cur.settles THEN o.to_status END, o.outcome,
           CASE WHEN cur.settles THEN 'late_answer' ELSE o.reason END,
           o.provider_message_id, o.lease_token, o.latency_ms,
           o.detail || jsonb_build_object('fenced', true, 'row_attempts', cur.attempts, 'settled', cur.settles),
           t.now
    FROM o JOIN cur ON cur.id = o.id, t
    ON CONFLICT (step_id, lease_token) WHERE kind IN ('provider_response', 'late_response') DO NOTHING
    RETURNING step_id, to_status
), settled AS (
    UPDATE email_steps s
    SET status = late.to_status,
        reason = 'late_answer',
        detail = o.message,
        provider_message_id = coalesce(o.provider_message_id, s.provider_message_id),
        unknown_since = NULL,
        closed_at = t.now,
        updated_at = t.now
    FROM late JOIN o ON o.id = late.step_id, t
    WHERE s.id = late.step_id AND late.to_status IS NOT NULL
    RETURNING s.id
), dequeued AS (
    DELETE FROM step_queue q USING late WHERE q.id = late.step_id AND late.to_status IS NOT NULL
)
SELECT o.id, late.step_id IS NOT NULL AS recorded, settled.id IS NOT NULL AS settled
FROM o
LEFT JOIN late ON late.step_id = o.id
LEFT JOIN settled ON settled.id = o.id;


-- name: step_release
-- Hand back rows claimed but never sent (graceful shutdown). The attempt is
-- uncounted because the adapter was never called; evidence says so. The queue row gives
-- up its lease; email_steps still holds the state the step was claimed from.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), o AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(lease_tokens)s::uuid[], %(attempts)s::int[])
        AS o(id, lease_token, attempt)
), released AS (
    UPDATE step_queue q
    SET attempts = q.attempts - 1,
        first_attempt_at = CASE WHEN q.attempts = 1 THEN NULL ELSE q.first_attempt_at END,
        dedupe_until = CASE WHEN q.attempts = 1 THEN NULL ELSE q.dedupe_until END,
        lease_owner = NULL,
        lease_token = NULL,
        lease_expires_at = NULL,
        next_attempt_at = t.now,
        updated_at = t.now
    FROM o, t
    WHERE q.id = o.id AND q.lease_token = o.lease_token AND q.attempts = o.attempt
    RETURNING q.id, q.provider, o.attempt, o.lease_token, t.now AS at
), noted AS (
    -- Why it waits again (a shutdown is rare: the wide row's one write here).
    UPDATE email_steps s
    SET reason = 'released', next_attempt_at = r.at, updated_at = r.at
    FROM released r
    WHERE s.id = r.id
    RETURNING s.id, s.run_id, s.status
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, lease_token, created_at)
    SELECT r.id, n.run_id, r.attempt, 'attempt_released', %(actor)s, 'in_flight', n.status, 'released',
           r.lease_token, r.at
    FROM released r JOIN noted n ON n.id = r.id
)
SELECT r.id, pg_notify('evq_steps', r.provider)::text IS NULL AS woke
FROM released r;


-- name: step_orphan_claims
-- After a claim whose answer was lost (the connection dropped as it committed),
-- rows can be in flight under this worker's name that it never received, so never
-- sent. Only rows whose lease token derives from one of those lost claims qualify
-- (step_claim derives every token from its claim id): a row of any other claim may
-- have reached an adapter, whatever the worker's memory says. Tokens the worker
-- holds or has begun sending are excluded too. step_release re-checks the lease.
SELECT q.id, q.lease_token, q.attempts
FROM step_queue q
JOIN unnest(%(claims)s::text[]) AS c(claim_id)
  ON q.lease_token = md5(c.claim_id || ':' || q.id::text)::uuid
WHERE q.lease_owner = %(owner)s
  AND NOT (q.lease_token = ANY(%(held)s::uuid[]));


-- name: step_rescue
-- Rows whose lease expired while in flight: the worker died or stalled, and the
-- attempt may have reached the provider (invariant 4). They become unknown (leaving
-- the queue), or retryable only while the provider's dedupe window covers another
-- whole lease. SKIP LOCKED lets every worker run the rescuer without doing the same row twice.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), expired AS (
    SELECT q.id, q.lease_token, q.lease_owner, q.lease_expires_at, q.attempts, q.first_attempt_at, q.dedupe_until,
           CASE WHEN q.dedupe_until > (SELECT now FROM t) + make_interval(secs => %(lease_seconds)s)
                     AND q.attempts - s.uncharged_attempts < coalesce(s.max_attempts, %(default_max_attempts)s)
                THEN 'retryable' ELSE 'unknown' END AS to_status
    -- LEFT: a queue row whose step is gone (none should be) is still taken, and deleted.
    FROM step_queue q LEFT JOIN email_steps s ON s.id = q.id
    WHERE q.lease_token IS NOT NULL AND q.lease_expires_at < (SELECT now FROM t)
    ORDER BY q.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF q SKIP LOCKED
), dequeued AS (
    DELETE FROM step_queue q USING expired e WHERE q.id = e.id AND e.to_status = 'unknown'
), requeued AS (
    UPDATE step_queue q
    SET lease_owner = NULL,
        lease_token = NULL,
        lease_expires_at = NULL,
        maybe_delivered = true,
        next_attempt_at = t.now,
        updated_at = t.now
    FROM expired e, t
    WHERE q.id = e.id AND e.to_status = 'retryable'
), rescued AS (
    UPDATE email_steps s
    SET status = e.to_status,
        attempts = e.attempts,
        first_attempt_at = e.first_attempt_at,
        dedupe_until = e.dedupe_until,
        reason = 'lease_expired',
        detail = 'lease held by ' || e.lease_owner || ' expired during attempt ' || e.attempts,
        maybe_delivered = true,
        unknown_since = CASE WHEN e.to_status = 'unknown' THEN t.now END,
        next_attempt_at = t.now,
        updated_at = t.now
    FROM expired e, t
    -- A lease left on a step that is not owed a send (no writer of evq leaves one) only loses
    -- its queue row: the step's own row, closed or waiting for a person, is not touched.
    WHERE s.id = e.id AND s.status IN ('pending', 'retryable')
    RETURNING s.id, s.run_id, s.attempts, s.status, e.lease_token, e.lease_owner, e.lease_expires_at, t.now AS at
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, lease_token, detail, created_at)
    SELECT r.id, r.run_id, r.attempts, 'lease_expired', %(actor)s, 'in_flight', r.status, 'lease_expired',
           r.lease_token,
           jsonb_build_object('lease_owner', r.lease_owner, 'lease_expired_at', r.lease_expires_at),
           r.at
    FROM rescued r
)
SELECT id, status FROM rescued;


-- name: step_close_windows
-- Retryable rows that may already have been delivered, whose provider no longer
-- dedupes our key for a whole lease: another request could send a second copy,
-- so they leave the queue and wait for reconciliation or an operator as unknown.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), closing AS (
    SELECT q.id, q.dedupe_until
    FROM step_queue q
    WHERE q.lease_token IS NULL AND q.maybe_delivered
      AND coalesce(q.dedupe_until <= (SELECT now FROM t) + make_interval(secs => %(lease_seconds)s), true)
    LIMIT %(limit)s
    FOR UPDATE OF q SKIP LOCKED
), dequeued AS (
    DELETE FROM step_queue q USING closing c WHERE q.id = c.id
), closed AS (
    UPDATE email_steps s
    SET status = 'unknown',
        reason = 'dedupe_window_closed',
        detail = 'the provider no longer deduplicates this key; another attempt could send a second copy',
        unknown_since = t.now,
        updated_at = t.now
    FROM closing c, t
    WHERE s.id = c.id AND s.status = 'retryable'
    RETURNING s.id, s.run_id, s.attempts, c.dedupe_until, t.now AS at
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, detail, created_at)
    SELECT c.id, c.run_id, c.attempts, 'window_closed', %(actor)s, 'retryable', 'unknown', 'dedupe_window_closed',
           jsonb_build_object('dedupe_until', c.dedupe_until), c.at
    FROM closed c
)
SELECT id FROM closed;


-- name: step_claimable_exists
SELECT EXISTS (
    SELECT 1 FROM step_queue q
    WHERE q.lease_token IS NULL
      AND q.next_attempt_at <= coalesce(%(now)s::timestamptz, now())
      AND q.provider = ANY(%(providers)s::text[])
      AND NOT (q.maybe_delivered AND coalesce(q.dedupe_until <= coalesce(%(now)s::timestamptz, now())
               + make_interval(secs => %(lease_seconds)s), true))
      -- Held by its provider's circuit: nothing to do until a probe is due.
      AND NOT EXISTS (
          SELECT 1 FROM provider_circuits c
          WHERE c.provider = q.provider AND c.state <> 'closed'
            AND NOT (c.state = 'open' AND c.probe_at <= coalesce(%(now)s::timestamptz, now()))
            AND NOT (c.state = 'half_open' AND c.probe_expires_at < coalesce(%(now)s::timestamptz, now())))
) AS claimable;



-- name: steps_waiting
-- What a drain leaves behind (`evq worker run --drain`, worker/runner.py): per provider, the
-- steps still owed a send: due now (in the queue, not under a lease, their time come: a
-- circuit that is not closed holds them), due later (a send_at or a retry's backoff, with
-- the earliest) and held for approval. Read once, when a drain ends.
SELECT w.provider, sum(w.due)::int AS due, sum(w.later)::int AS later, min(w.next_at) AS next_at,
       sum(w.held)::int AS held
FROM (SELECT q.provider,
             count(*) FILTER (WHERE q.next_attempt_at <= t.now) AS due,
             count(*) FILTER (WHERE q.next_attempt_at > t.now) AS later,
             min(q.next_attempt_at) FILTER (WHERE q.next_attempt_at > t.now) AS next_at,
             0 AS held
      FROM step_queue q, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS t
      WHERE q.lease_token IS NULL AND q.provider = ANY(%(providers)s::text[])
      GROUP BY q.provider
      UNION ALL
      SELECT s.provider, 0, 0, NULL, count(*)
      FROM email_steps s
      WHERE s.status = 'held' AND s.provider = ANY(%(providers)s::text[])
      GROUP BY s.provider) AS w
GROUP BY w.provider
ORDER BY w.provider;


-- name: rate_limit_take
-- Take up to %(want)s tokens from a provider's bucket (worker/ratelimit.py), before
-- the claim: the row lock makes concurrent takes from every worker on every host
-- queue up, so together they never get more than the rate. The refill comes from
-- the database clock; greatest(0, ...) and greatest(refilled_at, now) keep a take
-- whose statement started before the previous holder's from refilling twice. A
-- paused provider grants nothing and says for how long. No row: the caller seeds one.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    SELECT b.provider, b.paused_until,
           least(%(burst)s::float8, b.tokens + %(per_second)s::float8
                 * greatest(0, extract(epoch FROM t.now - b.refilled_at))::float8) AS available,
           coalesce(b.paused_until > t.now, false) AS paused
    FROM provider_rate_limits b, t
    WHERE b.provider = %(provider)s
    FOR UPDATE OF b
), g AS (
    SELECT cur.*,
           CASE WHEN cur.paused THEN 0 ELSE least(%(want)s::int, floor(cur.available)::int) END AS granted
    FROM cur
)
UPDATE provider_rate_limits b
SET tokens = g.available - g.granted,
    refilled_at = greatest(b.refilled_at, t.now)
FROM g, t
WHERE b.provider = g.provider
RETURNING g.granted,
          CASE WHEN g.paused THEN extract(epoch FROM g.paused_until - t.now)::float8 ELSE 0 END AS paused_for,
          CASE WHEN g.granted < %(want)s AND NOT g.paused
               THEN greatest(0, (1 - (g.available - g.granted)) / %(per_second)s::float8) ELSE 0 END AS next_token_in;


-- name: rate_limit_seed
-- A provider's first take: a full bucket (a concurrent seed wins, nothing changes).
INSERT INTO provider_rate_limits (provider, tokens, refilled_at)
VALUES (%(provider)s, %(burst)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (provider) DO NOTHING;


-- name: rate_limit_refund
-- Tokens a claim was granted but found no rows for: back in the bucket (never above its size).
UPDATE provider_rate_limits
SET tokens = least(%(burst)s::float8, tokens + %(tokens)s::float8)
WHERE provider = %(provider)s;


-- name: rate_limit_pause
-- The provider said we send too fast: no worker claims for it before now + seconds.
-- A pause only ever grows (two 429s at once keep the later end). A provider first
-- paused starts with an empty bucket that refills from now.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
)
INSERT INTO provider_rate_limits AS b (provider, tokens, refilled_at, paused_until)
SELECT %(provider)s, 0, t.now, t.now + make_interval(secs => %(seconds)s::float8)
FROM t
ON CONFLICT (provider) DO UPDATE
SET paused_until = greatest(b.paused_until, excluded.paused_until)
RETURNING extract(epoch FROM b.paused_until - (SELECT now FROM t))::float8 AS paused_for;

-- name: circuit_trip
-- Open a provider's circuit (worker/circuit.py): from closed (a fault, or consecutive
-- failures) with the first probe after probe_base; from half-open (the probe, or a send
-- while it was out, failed) with the probe backoff doubled, at most probe_max. An open
-- circuit stays as it is (FOR UPDATE re-reads a row another worker changed meanwhile,
-- so two workers opening it at once make one change and one event). The event row
-- goes with the change. `present` false: no row yet, the caller seeds one and asks again.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    SELECT c.provider, c.state AS from_state,
           CASE WHEN c.state = 'half_open' THEN c.probes + 1 ELSE 0 END AS probes
    FROM provider_circuits c
    WHERE c.provider = %(provider)s AND c.state <> 'open'
    FOR UPDATE OF c
), opened AS (
    UPDATE provider_circuits c
    SET state = 'open',
        reason = %(reason)s,
        detail = %(detail)s,
        opened_at = coalesce(c.opened_at, t.now),
        probes = cur.probes,
        probe_at = t.now + make_interval(secs => least(%(probe_max)s::float8,
                                                       %(probe_base)s::float8 * power(2::float8, cur.probes))),
        probe_owner = NULL,
        probe_expires_at = NULL,
        updated_at = t.now
    FROM cur, t
    WHERE c.provider = cur.provider
    RETURNING c.provider, cur.from_state, c.reason, c.detail, c.probes,
              extract(epoch FROM c.probe_at - t.now)::float8 AS probe_in, t.now AS at
), ev AS (
    INSERT INTO provider_circuit_events (provider, from_state, to_state, reason, detail, actor, probe_in, created_at)
    SELECT o.provider, o.from_state, 'open', o.reason, o.detail, %(actor)s, o.probe_in, o.at
    FROM opened o
)
SELECT EXISTS (SELECT 1 FROM provider_circuits c WHERE c.provider = %(provider)s) AS present,
       o.from_state, o.probes, o.probe_in
FROM (SELECT 1) AS one
LEFT JOIN opened o ON true;


-- name: circuit_seed
-- A provider's first circuit row: closed (a concurrent seed wins, nothing changes).
INSERT INTO provider_circuits (provider, state, updated_at)
VALUES (%(provider)s, 'closed', coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (provider) DO NOTHING;


-- name: circuit_close
-- The provider answered (a probe got through, or a send did): the circuit closes and
-- its steps are claimed again by every worker at its next claim.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    SELECT c.provider, c.state AS from_state
    FROM provider_circuits c
    WHERE c.provider = %(provider)s AND c.state <> 'closed'
    FOR UPDATE OF c
), closed AS (
    UPDATE provider_circuits c
    SET state = 'closed',
        reason = %(reason)s,
        detail = %(detail)s,
        opened_at = NULL,
        probe_at = NULL,
        probes = 0,
        probe_owner = NULL,
        probe_expires_at = NULL,
        updated_at = t.now
    FROM cur, t
    WHERE c.provider = cur.provider
    RETURNING c.provider, cur.from_state, t.now AS at
), ev AS (
    INSERT INTO provider_circuit_events (provider, from_state, to_state, reason, detail, actor, created_at)
    SELECT c.provider, c.from_state, 'closed', %(reason)s, %(detail)s, %(actor)s, c.at
    FROM closed c
)
SELECT provider, from_state FROM closed;


-- name: circuit_probe_take
-- One worker takes the probe of an open circuit whose probe is due (or of a half-open
-- one whose prober let its hold lapse: it died), only when a step is there to send:
-- the circuit turns half-open under its name, and its next claim (probe => true)
-- may take one step of that provider.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    SELECT c.provider, c.state AS from_state
    FROM provider_circuits c, t
    WHERE c.provider = %(provider)s
      AND ((c.state = 'open' AND c.probe_at <= t.now) OR (c.state = 'half_open' AND c.probe_expires_at < t.now))
      AND EXISTS (
          SELECT 1 FROM step_queue q
          WHERE q.lease_token IS NULL AND q.next_attempt_at <= t.now AND q.provider = c.provider
            AND NOT (q.maybe_delivered AND coalesce(q.dedupe_until <= t.now
                     + make_interval(secs => %(lease_seconds)s), true)))
    FOR UPDATE OF c
), taken AS (
    UPDATE provider_circuits c
    SET state = 'half_open',
        probe_at = NULL,
        probe_owner = %(owner)s,
        probe_expires_at = t.now + make_interval(secs => %(hold_seconds)s),
        updated_at = t.now
    FROM cur, t
    WHERE c.provider = cur.provider
    RETURNING c.provider, cur.from_state, c.probes, t.now AS at
), ev AS (
    INSERT INTO provider_circuit_events (provider, from_state, to_state, reason, detail, actor, created_at)
    SELECT k.provider, k.from_state, 'half_open', 'probe',
           'probe ' || (k.probes + 1) || ' since the circuit opened', %(owner)s, k.at
    FROM taken k
)
SELECT provider FROM taken;


-- name: circuit_probe_idle
-- A probe taken whose claim found no step after all (another path took it), or whose
-- step was handed back unsent (its worker stopped): back to open, the next probe after
-- probe_base, the backoff unchanged.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), back AS (
    UPDATE provider_circuits c
    SET state = 'open',
        probe_at = t.now + make_interval(secs => %(probe_base)s),
        probe_owner = NULL,
        probe_expires_at = NULL,
        updated_at = t.now
    FROM t
    WHERE c.provider = %(provider)s AND c.state = 'half_open' AND c.probe_owner = %(owner)s
    RETURNING c.provider, c.reason, t.now AS at
), ev AS (
    INSERT INTO provider_circuit_events (provider, from_state, to_state, reason, detail, actor, probe_in, created_at)
    SELECT b.provider, 'half_open', 'open', b.reason, %(detail)s, %(owner)s,
           %(probe_base)s::float8, b.at
    FROM back b
)
SELECT provider FROM back;


-- name: circuit_list
-- Every provider circuit there is a row for, as every worker sees it now.
SELECT c.provider, c.state, c.reason, c.detail, c.opened_at, c.probe_at, c.probes, c.probe_owner,
       c.probe_expires_at, c.updated_at,
       extract(epoch FROM c.probe_at - t.now)::float8 AS probe_in,
       extract(epoch FROM c.probe_expires_at - t.now)::float8 AS probe_hold_left,
       extract(epoch FROM t.now - c.opened_at)::float8 AS open_for,
       (SELECT count(*) FROM provider_circuit_events e WHERE e.provider = c.provider AND e.to_state = 'open') AS openings
FROM provider_circuits c, (SELECT coalesce(%(now)s::timestamptz, now()) AS now) AS t
ORDER BY c.provider;


-- name: notice_candidates
-- Steps just moved to a state that owes a notice (rejected; unknown when so
-- configured; accepted with some recipients refused) whose caller named an address
-- to tell, or whose API key has a default one (api_keys.notify_email). Run in the transaction of the transition itself, on rows it has just
-- changed (so already locked). A notice never owes a notice: it has notice_of set
-- and no notify. `refused` is what the accepting answer's evidence says was refused.
-- A send that was held (its hold is kept on the row) waited for a person, who vouched, by
-- approving it, for its recipients (learnt into known_recipients), never for its notify address
-- (the held page does not even show it): whatever became of it (denied, expired, cancelled, or
-- approved and then refused by the provider), its request's own notify address is told only if
-- the send's sender is known to be allowed to mail that very address (known_recipients), never
-- on the request's word alone: a stranger there would get "[delivery failed] <the agent's
-- subject>" from evq, unheld and uncharged (issue 29; its review found the approved-then-refused
-- case). The key's own address (an admin set it) is not the request's word; the key's feed
-- (key_events) has the rejection either way.
SELECT s.id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.provider, s.payload, s.status,
       s.reason, s.detail, s.attempts, coalesce(s.notify, k.notify_email) AS notify,
       CASE WHEN s.notify IS NULL THEN k.name END AS notify_key,
       CASE WHEN s.reason = 'partially_refused' THEN (
           SELECT e.detail -> 'refused'
           FROM evidence e
           WHERE e.step_id = s.id AND e.outcome = 'accepted' AND e.kind IN ('provider_response', 'late_response')
           ORDER BY e.id DESC
           LIMIT 1) END AS refused
FROM email_steps s
JOIN decisions d ON d.id = s.decision_id
-- The key that enqueued the step: its default target when the request named none.
LEFT JOIN api_keys k ON k.key_id = d.actor_key_id
WHERE s.id = ANY(%(ids)s::bigint[])
  AND (s.status = ANY(%(statuses)s::text[]) OR (s.status = 'accepted' AND s.reason = 'partially_refused'))
  AND coalesce(s.notify, k.notify_email) IS NOT NULL
  AND s.notice_of IS NULL
  AND (s.notify IS NULL
       OR s.hold IS NULL
       OR EXISTS (SELECT 1 FROM known_recipients kr
                  WHERE kr.sender = lower(s.payload -> 'from' ->> 'email') AND kr.recipient = lower(s.notify)))
ORDER BY s.id;


-- name: notice_enqueue
-- The notices as email steps, each with its decision and its key in the key ledger (as
-- step_enqueue writes them), and notice_enqueued evidence on the step it tells about, in one
-- statement. A notice's key is derived from its step's (and, for a bounce or complaint, the
-- event's type), so a transition recorded twice (a commit retried after its acknowledgement was
-- lost), or a second event of a kind whose notice was pruned since, meets the ledger and writes
-- nothing. Never an error: it runs in the transaction of the transition it is about, which must
-- commit, so the step keeps its ON CONFLICT DO NOTHING (a notice whose derived run and step ids
-- some other step held would be left unwritten, its key kept by the ledger, as it was left before).
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), n AS (
    SELECT n.*, nextval('decisions_id_seq'::regclass) AS decision_id, nextval('email_steps_id_seq'::regclass) AS id
    FROM unnest(
        %(notice_of)s::bigint[], %(kinds)s::text[], %(run_ids)s::text[], %(step_ids)s::text[], %(keys)s::text[],
        %(message_ids)s::text[], %(providers)s::text[], %(payloads)s::jsonb[], %(digests)s::text[],
        %(intents)s::text[], %(rationales)s::jsonb[]
    ) AS n(notice_of, kind, run_id, step_id, idempotency_key, message_id, provider, payload, payload_sha256,
           intent, rationale)
), k AS (
    INSERT INTO step_keys (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256, created_at)
    SELECT n.idempotency_key, n.id, n.run_id, n.step_id, n.message_id, n.provider, decode(n.payload_sha256, 'hex'),
           t.now
    FROM n, t
    WHERE NOT EXISTS (SELECT 1 FROM email_steps s WHERE s.idempotency_key = n.idempotency_key)
      AND NOT EXISTS (SELECT 1 FROM email_steps s WHERE s.run_id = n.run_id AND s.step_id = n.step_id)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING id
), step AS (
    INSERT INTO email_steps (
        id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload, payload_sha256,
        notice_of, next_attempt_at, created_at, updated_at
    )
    SELECT n.id, n.run_id, n.step_id, n.decision_id, n.idempotency_key, n.message_id, n.provider, n.payload,
           n.payload_sha256, n.notice_of, t.now, t.now, t.now
    FROM n JOIN k ON k.id = n.id, t
    ON CONFLICT DO NOTHING
    RETURNING id, run_id, step_id, idempotency_key, decision_id, provider, notice_of, payload, next_attempt_at
), queued AS (
    INSERT INTO step_queue (id, provider, next_attempt_at)
    SELECT step.id, step.provider, step.next_attempt_at FROM step
), decision AS (
    INSERT INTO decisions (id, run_id, step_id, intent, tool, rationale, decided_at, created_at)
    SELECT step.decision_id, step.run_id, step.step_id, n.intent, 'evq-notice', n.rationale, t.now, t.now
    FROM step JOIN n ON n.decision_id = step.decision_id, t
), told AS (
    INSERT INTO evidence (step_id, run_id, kind, actor, reason, detail, created_at)
    SELECT step.notice_of, step.run_id, 'notice_enqueued', %(actor)s, n.kind,
           jsonb_build_object(
               'notice_step', step.id,
               'notice_key', step.idempotency_key,
               'to', step.payload -> 'to' -> 0 ->> 'email',
               'message', 'notice of ' || n.kind || ' queued as step ' || step.id || ' to '
                          || (step.payload -> 'to' -> 0 ->> 'email')),
           t.now
    FROM step JOIN n ON n.decision_id = step.decision_id, t
)
SELECT step.id, step.notice_of
FROM step
CROSS JOIN LATERAL (SELECT pg_notify('evq_steps', step.provider)) AS wake
ORDER BY step.id;


-- name: step_reconcile_claim
-- The next unknown row the reconciler may ask its provider about. No lock is held
-- while the provider answers: the claim only moves reconcile_after forward (a hold
-- of about a lease), so other workers' reconcilers skip the row meanwhile and take
-- it again if this one dies. SKIP LOCKED keeps concurrent claims apart.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), picked AS (
    SELECT s.id
    FROM email_steps s
    WHERE s.status = 'unknown'
      AND s.provider = ANY(%(providers)s::text[])
      AND coalesce(s.reconcile_after, '-infinity') <= (SELECT now FROM t)
      AND s.reconcile_checks < %(max_checks)s
    ORDER BY s.reconcile_after NULLS FIRST, s.unknown_since, s.id
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE email_steps s
SET reconcile_after = t.now + make_interval(secs => %(hold_seconds)s)
FROM picked, t
WHERE s.id = picked.id
RETURNING s.id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.provider, s.reconcile_checks;


-- name: step_reconcile_found
-- The provider has the message: the row, if still unknown (an operator may have
-- closed it meanwhile), is closed as accepted with the provider's id and the lookup
-- as evidence. Returns the closed row's created_at and closed_at (none if not closed).
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), closed AS (
    UPDATE email_steps s
    SET status = 'accepted',
        reason = 'reconciled',
        detail = %(message)s,
        provider_message_id = coalesce(%(provider_message_id)s, s.provider_message_id),
        unknown_since = NULL,
        closed_at = t.now,
        reconcile_after = NULL,
        reconcile_checks = s.reconcile_checks + 1,
        updated_at = t.now
    FROM t
    WHERE s.id = %(id)s AND s.status = 'unknown'
    RETURNING s.id, s.run_id, s.attempts, s.created_at, t.now AS at
), ev AS (
    INSERT INTO evidence (
        step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
        provider_message_id, detail, created_at
    )
    SELECT c.id, c.run_id, c.attempts, 'reconciled', %(actor)s, 'unknown', 'accepted', 'accepted', 'reconciled',
           %(provider_message_id)s, %(detail)s::jsonb, c.at
    FROM closed c
)
SELECT created_at, at AS closed_at FROM closed;


-- name: step_reconcile_absent
-- The provider says it has no such message. Absence is not proof (it may not have
-- indexed the message yet, or may keep no record of it): the row stays unknown, the
-- answer is kept as evidence for the operator, and the next lookup waits longer.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), checked AS (
    UPDATE email_steps s
    SET reconcile_checks = s.reconcile_checks + 1,
        reconcile_after = t.now + make_interval(secs => %(next_check)s)
    FROM t
    WHERE s.id = %(id)s AND s.status = 'unknown'
    RETURNING s.id, s.run_id, s.attempts, s.reconcile_checks, t.now AS at
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, reason, detail, created_at)
    SELECT c.id, c.run_id, c.attempts, 'reconciled', %(actor)s, 'unknown', 'reconcile_absent',
           %(detail)s::jsonb, c.at
    FROM checked c
)
SELECT count(*)::int AS n FROM checked;


-- name: delivery_record
-- One verified webhook event (worker/delivery.py), in one statement: stored unless the
-- provider sent it before (UNIQUE (provider, event_id): a concurrent duplicate waits for
-- the first and then writes nothing); matched to its step by the evq_key tag (worker/delivery.py,
-- key_tag): the key's digest (the SHA-256 of the key's bytes: exactly the expression of the
-- hash index ix_step_keys_key_sha256, on the key ledger) and the part of the Message-ID's digest,
-- which another installation's step with the same key does not share (a bare digest, as evq 0.2.0
-- sent it, names only a step 0.2.0 made: below wire_keys_from); else by Message-ID
-- (uq_step_keys_message_id); the step, if still unknown and the
-- type proves the provider had it, closed accepted (reason webhook) exactly as
-- step_reconcile_found closes it, guarded by the state; and one delivery_event evidence
-- row on the matched step, which carries the close when there was one. The key_events
-- trigger sees the same evidence a reconciler close writes (no feed event for accepted).
-- Only a step whose provider is one this webhook can report on (%(step_providers)s, from
-- Settings.webhook_step_providers) is matched: an event naming another provider's step is
-- kept unmatched, its detail saying which step it named and why it was not acted on.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), named AS (
    -- Through the key ledger (insert-once, where both indexes live), to the step it still holds.
    SELECT 1 AS probe, s.id, s.provider
    FROM step_keys k JOIN email_steps s ON s.id = k.id
    WHERE %(digest)s::bytea IS NOT NULL AND k.pruned_at IS NULL
      AND sha256(decode(replace(k.idempotency_key, '\', '\\'), 'escape')) = %(digest)s::bytea
      AND CASE WHEN %(message_tag)s::text IS NULL
               THEN s.id < (SELECT p.wire_keys_from FROM api_key_pepper p WHERE p.id = 1)
               ELSE left(encode(sha256(convert_to(k.message_id, 'UTF8')), 'hex'), 12) = %(message_tag)s::text END
    UNION ALL
    SELECT 2, s.id, s.provider
    FROM step_keys k JOIN email_steps s ON s.id = k.id
    WHERE k.message_id = %(message_id)s AND k.pruned_at IS NULL
), m AS (
    SELECT (SELECT n.id FROM named n WHERE n.provider = ANY(%(step_providers)s::text[])
            ORDER BY n.probe LIMIT 1) AS step_id,
           (SELECT jsonb_build_object(
                       'step', n.id, 'step_provider', n.provider,
                       'why', 'the step was sent by provider ' || n.provider || ', whose messages the '
                              || %(provider)s::text || ' webhook does not report')
            FROM named n WHERE NOT n.provider = ANY(%(step_providers)s::text[])
            ORDER BY n.probe LIMIT 1) AS foreign_step
), ins AS (
    INSERT INTO delivery_events (
        provider, event_id, type, occurred_at, received_at, step_id, key_digest, message_id,
        provider_message_id, recipient, detail
    )
    SELECT %(provider)s::text, %(event_id)s::text, %(type)s::text, %(occurred_at)s::timestamptz, t.now, m.step_id,
           %(key_digest)s::text, %(message_id)s::text, %(provider_message_id)s::text, %(recipient)s::text,
           CASE WHEN m.step_id IS NULL AND m.foreign_step IS NOT NULL
                THEN %(detail)s::jsonb || jsonb_build_object('not_matched', m.foreign_step)
                ELSE %(detail)s::jsonb END
    FROM t, m
    ON CONFLICT (provider, event_id) DO NOTHING
    RETURNING id, step_id, received_at
), closed AS (
    UPDATE email_steps s
    SET status = 'accepted',
        reason = 'webhook',
        detail = %(message)s::text,
        provider_message_id = coalesce(%(provider_message_id)s::text, s.provider_message_id),
        unknown_since = NULL,
        closed_at = t.now,
        reconcile_after = NULL,
        updated_at = t.now
    FROM t, ins
    WHERE s.id = ins.step_id AND s.status = 'unknown' AND %(proves)s::boolean
    RETURNING s.id, s.created_at, t.now AS at
), ev AS (
    INSERT INTO evidence (
        step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
        provider_message_id, detail, created_at
    )
    SELECT s.id, s.run_id, s.attempts, 'delivery_event', %(actor)s,
           CASE WHEN c.id IS NOT NULL THEN 'unknown' END,
           CASE WHEN c.id IS NOT NULL THEN 'accepted' END,
           CASE WHEN c.id IS NOT NULL THEN 'accepted' END,
           CASE WHEN c.id IS NOT NULL THEN 'webhook' ELSE %(type)s::text END,
           %(provider_message_id)s::text,
           %(detail)s::jsonb || jsonb_build_object(
               'delivery_event', ins.id, 'provider', %(provider)s::text, 'event_id', %(event_id)s::text,
               'type', %(type)s::text, 'occurred_at', %(occurred_at)s::timestamptz,
               'recipient', %(recipient)s::text, 'message', %(message)s::text),
           t.now
    FROM ins
    JOIN steps_now s ON s.id = ins.step_id
    LEFT JOIN closed c ON c.id = s.id
    CROSS JOIN t
    RETURNING id
)
SELECT ins.id, ins.step_id, ins.received_at, coalesce((SELECT c.id IS NOT NULL FROM closed c), false) AS closed,
       (SELECT c.created_at FROM closed c) AS created_at, (SELECT c.at FROM closed c) AS closed_at,
       s.status, s.closed_at AS accepted_at
FROM ins
LEFT JOIN steps_now s ON s.id = ins.step_id;


-- name: delivery_get
-- A duplicate's first row (the provider sent the same event again).
SELECT id, step_id FROM delivery_events WHERE provider = %(provider)s AND event_id = %(event_id)s;


-- name: delivery_notice_candidates
-- The step an event that tells notify (a hard bounce, a complaint) matched, if it is
-- accepted and someone is to be told: its notify address, or its key's default one
-- (as notice_candidates, and as there a held send's notify address only if its sender is known
-- to mail it). A notice never owes a notice.
SELECT s.id, s.run_id, s.step_id, s.idempotency_key, s.message_id, s.provider, s.payload, s.status,
       s.reason, s.detail, s.attempts, coalesce(s.notify, k.notify_email) AS notify,
       CASE WHEN s.notify IS NULL THEN k.name END AS notify_key
FROM email_steps s
JOIN decisions d ON d.id = s.decision_id
LEFT JOIN api_keys k ON k.key_id = d.actor_key_id
WHERE s.id = %(id)s
  AND s.status = 'accepted'
  AND coalesce(s.notify, k.notify_email) IS NOT NULL
  AND s.notice_of IS NULL
  AND (s.notify IS NULL
       OR s.hold IS NULL
       OR EXISTS (SELECT 1 FROM known_recipients kr
                  WHERE kr.sender = lower(s.payload -> 'from' ->> 'email') AND kr.recipient = lower(s.notify)));


-- name: delivery_list
-- A page of delivery events newest first (OFFSET, LIMIT); a NULL (or false) filter is off. The
-- matched step's run and step ids beside it. delivery_count, in the same snapshot, is its total.
SELECT d.id, d.provider, d.event_id, d.type, d.occurred_at, d.received_at, d.step_id AS step,
       s.run_id, s.step_id, d.key_digest, d.message_id, d.provider_message_id, d.recipient, d.detail
FROM delivery_events d
LEFT JOIN email_steps s ON s.id = d.step_id
WHERE (%(step)s::bigint IS NULL OR d.step_id = %(step)s::bigint)
  AND (NOT %(unmatched)s::boolean OR d.step_id IS NULL)
  AND (%(provider)s::text IS NULL OR d.provider = %(provider)s::text)
  AND (%(before_id)s::bigint IS NULL OR d.id < %(before_id)s::bigint)
ORDER BY d.id DESC
OFFSET %(offset)s
LIMIT %(limit)s;


-- name: delivery_count
-- How many events delivery_list's filters match, counted up to %(count_cap)s + 1 (as step_list's
-- totals): on the index delivery_list reads (a step's, the unmatched ones', or the ids).
SELECT count(*)::int AS n
FROM (SELECT 1 FROM delivery_events d
      WHERE (%(step)s::bigint IS NULL OR d.step_id = %(step)s::bigint)
        AND (NOT %(unmatched)s::boolean OR d.step_id IS NULL)
        AND (%(provider)s::text IS NULL OR d.provider = %(provider)s::text)
        AND (%(before_id)s::bigint IS NULL OR d.id < %(before_id)s::bigint)
      LIMIT %(count_cap)s::int + 1) AS c;


-- name: delivery_states
-- Each step's latest delivery state: the type of its latest event by when it happened
-- (the provider's time, else when evq received it), and how many it has.
SELECT DISTINCT ON (d.step_id) d.step_id, d.type AS state, coalesce(d.occurred_at, d.received_at) AS at,
       count(*) OVER (PARTITION BY d.step_id) AS events
FROM delivery_events d
WHERE d.step_id = ANY(%(ids)s::bigint[])
ORDER BY d.step_id, coalesce(d.occurred_at, d.received_at) DESC, d.id DESC;


-- name: step_get
SELECT s.*, extract(epoch FROM now() - s.created_at)::float8 AS age_seconds
FROM steps_now s
WHERE s.id = %(id)s;


-- name: steps_get
-- get_steps: several steps at once (the held queue's page), as step_get reads one.
SELECT s.*, extract(epoch FROM now() - s.created_at)::float8 AS age_seconds
FROM steps_now s
WHERE s.id = ANY(%(ids)s::bigint[]);


-- name: decision_get
SELECT * FROM decisions WHERE id = %(id)s;


-- name: decisions_get
SELECT * FROM decisions WHERE id = ANY(%(ids)s::bigint[]) ORDER BY created_at, id;


-- name: evidence_for_step
SELECT * FROM evidence WHERE step_id = %(id)s ORDER BY id;


-- name: evidence_for_steps
SELECT * FROM evidence WHERE step_id = ANY(%(ids)s::bigint[]) ORDER BY step_id, id;


-- name: evidence_last_answers
-- Each step's latest answer from its provider (an attempt's, a late one, or a
-- reconciler lookup), for the operator's list of unknown rows.
SELECT DISTINCT ON (e.step_id) e.step_id, e.id, e.kind, e.outcome, e.reason, e.provider_message_id,
       e.detail, e.created_at
FROM evidence e
WHERE e.step_id = ANY(%(ids)s::bigint[])
  AND e.kind IN ('provider_response', 'late_response', 'reconciled')
ORDER BY e.step_id, e.id DESC;


-- name: step_list_facts
-- The columns a state's list shows beyond step_list's summary, for one page of ids.
SELECT s.id, s.message_id, s.provider_message_id, s.held_since, s.hold_expires_at, s.hold
FROM email_steps s
WHERE s.id = ANY(%(ids)s::bigint[]);


-- name: step_list
-- Filters are optional: a NULL parameter disables its condition. Unknown and held
-- rows sort oldest first (the operators' queues: by unknown_since, by held_since);
-- everything else newest first.
-- At a million rows neither a sort of every match nor a full count is affordable:
-- `base` (the filters but the search and the states) is NOT MATERIALIZED, so each use is
-- planned on its own with its conditions pushed into the scan. Without a search the page
-- is the first `window` rows (limit + offset) of each state, each read in its index's
-- order (unknown, held: their partial indexes; the rest ix_email_steps_status_created_at
-- backwards), merged and cut. A state's branch is switched off by a constant test on
-- %(statuses)s that the planner folds away; a search switches them all off by LIMIT 0
-- (a constant-false WHERE would still plan, and start, parallel workers).
-- The search (worker/search.py's forms; NULL: that form does not apply) is one OR whose
-- every arm is an index's exact expression, so `hits` is a BitmapOr of index scans: the
-- step id, evq_recipient_keys (GIN), message_id, provider_message_id, idempotency_key,
-- run_id, and the enqueuing key's decisions (ix_decisions_actor, then decision_id = ANY,
-- which a bitmap can take where IN (subquery) would be a filter; `keyed`, apart from the
-- BitmapOr: an index-only read of ix_email_steps_decision_id's INCLUDE columns, less the
-- steps `found` already has, so a step two forms find is one hit). Each optional arm is
-- written "p IS NOT NULL AND ...": a NULL p folds it away to false rather than leaving a
-- NULL arm that no index answers. Its rows are read once (MATERIALIZED) and sorted:
-- walking a state's index with the search as a filter costs evq_recipient_keys per row
-- passed over, far more than reading the hits. %(search_since)s (not NULL: a window,
-- store/steps.py's SEARCH_WINDOWS) keeps of `found` only the unknown and held hits and the
-- others created since then (a BitmapAnd with each state's (status, created_at) range, one
-- arm per state so each is an index range); `recent` says how many of the page's newest-first
-- rows the window holds (the caller widens it when too few; 0 with no window, not read), and `older` holds the hits it
-- cut, up to the cap, counted for the total only (less `keyed`'s, so a step both find counts
-- once) and as `cut` (none cut: the window changed nothing).
-- The total counts at most count_cap + 1 rows (more than count_cap: the caller says
-- "count_cap+"; docs/design.md, "Search").
-- A new state needs its branch here and in step_count_by_status (worker/states.py's Status).
-- In flight is not a state email_steps holds (the claim writes only the queue row, and the
-- step keeps the state it was claimed from): its branch reads the queue's leased rows
-- (few: one per send under way), pending's and retryable's leave them out, and a search's
-- hits are named in flight by the same test.
-- The total is counted apart from the page, so it stays right when the offset
-- runs past the end (then the one row back carries the total and no step).
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), base AS NOT MATERIALIZED (
    SELECT s.id, s.status, s.unknown_since, s.held_since, s.created_at, s.payload, s.message_id,
           s.provider_message_id, s.idempotency_key, s.run_id, s.decision_id
    FROM email_steps s
    WHERE (%(ids)s::bigint[] IS NULL OR s.id = ANY(%(ids)s::bigint[]))
      AND (%(run_id)s::text IS NULL OR s.run_id = %(run_id)s)
      AND (%(provider)s::text IS NULL OR s.provider = %(provider)s)
      AND (%(created_before)s::timestamptz IS NULL
           OR coalesce(s.unknown_since, s.created_at) < %(created_before)s::timestamptz)
      AND (%(recipient_domain)s::text IS NULL
           OR evq_recipient_keys(s.payload) @> ARRAY['@' || lower(%(recipient_domain)s::text)])
), matched AS NOT MATERIALIZED (
    SELECT b.id, b.status, b.unknown_since, b.held_since, b.created_at
    FROM base b
    WHERE %(search)s::text IS NOT NULL
      AND ((%(search_id)s::bigint IS NOT NULL AND b.id = %(search_id)s::bigint)
           OR (%(search_recipient)s::text IS NOT NULL
               AND evq_recipient_keys(b.payload) @> ARRAY[%(search_recipient)s::text])
           OR b.id = (SELECT k.id FROM step_keys k
                       WHERE k.message_id = %(search_message_id)s::text AND k.pruned_at IS NULL)
           OR b.provider_message_id = %(search)s::text
           OR b.idempotency_key = %(search)s::text
           OR b.run_id = %(search)s::text)
), found AS MATERIALIZED (
    SELECT m.id, m.status, m.unknown_since, m.held_since, m.created_at
    FROM matched m
    WHERE %(search_since)s::timestamptz IS NULL
       OR m.status = 'unknown' OR m.status = 'held'
       OR (m.status = 'pending' AND m.created_at >= %(search_since)s::timestamptz)
       OR (m.status = 'retryable' AND m.created_at >= %(search_since)s::timestamptz)
       OR (m.status = 'accepted' AND m.created_at >= %(search_since)s::timestamptz)
       OR (m.status = 'rejected' AND m.created_at >= %(search_since)s::timestamptz)
), keyed AS MATERIALIZED (
    SELECT b.id, b.status, b.unknown_since, b.held_since, b.created_at
    FROM base b
    WHERE %(search)s::text IS NOT NULL
      AND b.decision_id = ANY(ARRAY(SELECT d.id FROM decisions d WHERE d.actor = %(search)s::text))
      AND NOT EXISTS (SELECT 1 FROM found f WHERE f.id = b.id)
), older AS MATERIALIZED (
    SELECT m.id
    FROM matched m
    WHERE %(search_since)s::timestamptz IS NOT NULL
      AND m.status <> 'unknown' AND m.status <> 'held' AND m.created_at < %(search_since)s::timestamptz
      AND (%(statuses)s::text[] IS NULL
           OR CASE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id = m.id AND q.lease_token IS NOT NULL) THEN 'in_flight' ELSE m.status END
              = ANY(%(statuses)s::text[]))
      AND NOT EXISTS (SELECT 1 FROM keyed k WHERE k.id = m.id)
    LIMIT %(count_cap)s::int + 1
), hits AS MATERIALIZED (
    SELECT h.id, CASE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id = h.id AND q.lease_token IS NOT NULL) THEN 'in_flight' ELSE h.status END AS status,
           h.unknown_since, h.held_since, h.created_at
    FROM (SELECT f.id, f.status, f.unknown_since, f.held_since, f.created_at FROM found f
          UNION ALL
          SELECT k.id, k.status, k.unknown_since, k.held_since, k.created_at FROM keyed k) h
), firsts AS (
    (SELECT m.id, m.status, m.unknown_since AS waiting_since, m.created_at FROM base m
     WHERE m.status = 'unknown' AND (%(statuses)s::text[] IS NULL OR 'unknown' = ANY(%(statuses)s::text[]))
     ORDER BY m.unknown_since, m.id LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    (SELECT m.id, m.status, m.held_since, m.created_at FROM base m
     WHERE m.status = 'held' AND (%(statuses)s::text[] IS NULL OR 'held' = ANY(%(statuses)s::text[]))
     ORDER BY m.held_since, m.id LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    (SELECT m.id, m.status, NULL, m.created_at FROM base m
     WHERE m.status = 'pending' AND (%(statuses)s::text[] IS NULL OR 'pending' = ANY(%(statuses)s::text[]))
       AND NOT EXISTS (SELECT 1 FROM step_queue q WHERE q.id = m.id AND q.lease_token IS NOT NULL)
     ORDER BY m.created_at DESC, m.id DESC LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    (SELECT m.id, 'in_flight', NULL, m.created_at FROM step_queue q JOIN base m ON m.id = q.id
     WHERE q.lease_token IS NOT NULL AND (%(statuses)s::text[] IS NULL OR 'in_flight' = ANY(%(statuses)s::text[]))
     ORDER BY m.created_at DESC, m.id DESC LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    (SELECT m.id, m.status, NULL, m.created_at FROM base m
     WHERE m.status = 'retryable' AND (%(statuses)s::text[] IS NULL OR 'retryable' = ANY(%(statuses)s::text[]))
       AND NOT EXISTS (SELECT 1 FROM step_queue q WHERE q.id = m.id AND q.lease_token IS NOT NULL)
     ORDER BY m.created_at DESC, m.id DESC LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    (SELECT m.id, m.status, NULL, m.created_at FROM base m
     WHERE m.status = 'accepted' AND (%(statuses)s::text[] IS NULL OR 'accepted' = ANY(%(statuses)s::text[]))
     ORDER BY m.created_at DESC, m.id DESC LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    (SELECT m.id, m.status, NULL, m.created_at FROM base m
     WHERE m.status = 'rejected' AND (%(statuses)s::text[] IS NULL OR 'rejected' = ANY(%(statuses)s::text[]))
     ORDER BY m.created_at DESC, m.id DESC LIMIT CASE WHEN %(search)s::text IS NULL THEN %(window)s::bigint ELSE 0 END)
    UNION ALL
    SELECT h.id, h.status, coalesce(h.unknown_since, h.held_since), h.created_at FROM hits h
    WHERE %(statuses)s::text[] IS NULL OR h.status = ANY(%(statuses)s::text[])
), page AS (
    SELECT f.id
    FROM firsts f
    ORDER BY CASE WHEN f.status IN ('unknown', 'held') THEN f.waiting_since END ASC NULLS LAST,
             CASE WHEN f.status IN ('unknown', 'held') THEN f.id END ASC, f.created_at DESC, f.id DESC
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT total.n AS total,
       (SELECT count(*)::int FROM hits h
        WHERE h.status <> 'unknown' AND h.status <> 'held'
          AND %(search_since)s::timestamptz IS NOT NULL AND h.created_at >= %(search_since)s::timestamptz
          AND (%(statuses)s::text[] IS NULL OR h.status = ANY(%(statuses)s::text[]))) AS recent,
       (SELECT count(*)::int FROM older) AS cut,
       s.id, s.run_id, s.step_id, s.status, s.reason, s.provider, s.attempts,
       ARRAY(SELECT r ->> 'email'
             FROM jsonb_array_elements(s.payload -> 'to') r
             UNION ALL SELECT r ->> 'email' FROM jsonb_array_elements(s.payload -> 'cc') r
             UNION ALL SELECT r ->> 'email' FROM jsonb_array_elements(s.payload -> 'bcc') r) AS recipients,
       s.payload ->> 'subject' AS subject,
       s.created_at, s.updated_at, s.unknown_since, s.closed_at, s.maybe_delivered,
       extract(epoch FROM t.now - coalesce(s.unknown_since, s.created_at))::float8 AS age_seconds
FROM (SELECT count(*)::int AS n
      -- One branch per state, its status a constant, so each reads its state's index (a
      -- status = ANY(...) test matches no partial index: with a filter that few rows pass,
      -- such as a provider, it read the whole table, 1.4 s at a million steps).
      FROM (SELECT 1 FROM ((SELECT b.status FROM (
                      SELECT m.status FROM base m WHERE m.status = 'unknown'
                        AND (%(statuses)s::text[] IS NULL OR 'unknown' = ANY(%(statuses)s::text[]))
                      UNION ALL
                      SELECT m.status FROM base m WHERE m.status = 'held'
                        AND (%(statuses)s::text[] IS NULL OR 'held' = ANY(%(statuses)s::text[]))
                      UNION ALL
                      SELECT m.status FROM base m WHERE m.status = 'pending'
                        AND (%(statuses)s::text[] IS NULL OR 'pending' = ANY(%(statuses)s::text[]))
                        AND NOT EXISTS (SELECT 1 FROM step_queue q WHERE q.id = m.id AND q.lease_token IS NOT NULL)
                      UNION ALL
                      SELECT 'in_flight' FROM step_queue q JOIN base m ON m.id = q.id
                      WHERE q.lease_token IS NOT NULL
                        AND (%(statuses)s::text[] IS NULL OR 'in_flight' = ANY(%(statuses)s::text[]))
                      UNION ALL
                      SELECT m.status FROM base m WHERE m.status = 'retryable'
                        AND (%(statuses)s::text[] IS NULL OR 'retryable' = ANY(%(statuses)s::text[]))
                        AND NOT EXISTS (SELECT 1 FROM step_queue q WHERE q.id = m.id AND q.lease_token IS NOT NULL)
                      UNION ALL
                      SELECT m.status FROM base m WHERE m.status = 'accepted'
                        AND (%(statuses)s::text[] IS NULL OR 'accepted' = ANY(%(statuses)s::text[]))
                      UNION ALL
                      SELECT m.status FROM base m WHERE m.status = 'rejected'
                        AND (%(statuses)s::text[] IS NULL OR 'rejected' = ANY(%(statuses)s::text[]))) b
                      LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END)
                     UNION ALL
                     SELECT h.status FROM hits h
                     WHERE %(statuses)s::text[] IS NULL OR h.status = ANY(%(statuses)s::text[])
                     UNION ALL
                     SELECT NULL FROM older) u
            LIMIT %(count_cap)s::int + 1) c) AS total
CROSS JOIN t
LEFT JOIN (page JOIN steps_now s ON s.id = page.id) ON true
-- The page's order again (a join does not keep it).
ORDER BY CASE WHEN s.status IN ('unknown', 'held') THEN coalesce(s.unknown_since, s.held_since) END ASC NULLS LAST,
         CASE WHEN s.status IN ('unknown', 'held') THEN s.id END ASC, s.created_at DESC, s.id DESC;


-- name: step_count_by_status
-- Each state's count of the steps a filter (step_list's, less the states, the page and
-- its order) matches, at most count_cap + 1 each: the ops page's tabs. The same `base` as
-- step_list and the same search (keep the two in step). Without a search, one constant
-- branch per state, so each count reads that state's index (ix_email_steps_status_created_at,
-- or the in-flight, unknown or held partial index) and stops at the cap.
-- A search never reads all its hits here (step_list reads them for its page): the key-name
-- arm (`keyed`) is an index-only read (ix_decisions_actor, ix_email_steps_decision_id with its INCLUDE columns);
-- the other arms are read twice, as a BitmapAnd of the search's indexes with every state's
-- index but accepted's (those states' hits only: each counted, however many), and as
-- accepted's hits up to the cap (accepted is where nearly every step ends up: the one state
-- whose hits are most of a big search's). A step both arms find is counted once (UNION).
-- A new state needs its line here (and in `searched`'s states if it is not accepted).
-- In flight is the queue's leased rows (step_list says why); pending and retryable leave them out.
WITH base AS NOT MATERIALIZED (
    SELECT s.id, s.status, s.unknown_since, s.held_since, s.created_at, s.payload, s.message_id,
           s.provider_message_id, s.idempotency_key, s.run_id, s.decision_id
    FROM email_steps s
    WHERE (%(ids)s::bigint[] IS NULL OR s.id = ANY(%(ids)s::bigint[]))
      AND (%(run_id)s::text IS NULL OR s.run_id = %(run_id)s)
      AND (%(provider)s::text IS NULL OR s.provider = %(provider)s)
      AND (%(created_before)s::timestamptz IS NULL
           OR coalesce(s.unknown_since, s.created_at) < %(created_before)s::timestamptz)
      AND (%(recipient_domain)s::text IS NULL
           OR evq_recipient_keys(s.payload) @> ARRAY['@' || lower(%(recipient_domain)s::text)])
), keyed AS MATERIALIZED (
    SELECT b.id, b.status
    FROM base b
    WHERE %(search)s::text IS NOT NULL
      AND b.decision_id = ANY(ARRAY(SELECT d.id FROM decisions d WHERE d.actor = %(search)s::text))
), searched AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id = u.id AND q.lease_token IS NOT NULL) THEN 'in_flight' ELSE u.status END AS status,
           count(*)::int AS n
    FROM (SELECT b.id, b.status
          FROM base b
          WHERE %(search)s::text IS NOT NULL
            AND (b.status = 'held' OR b.status = 'pending' OR b.status = 'retryable'
                 OR b.status = 'unknown' OR b.status = 'rejected')
            AND ((%(search_id)s::bigint IS NOT NULL AND b.id = %(search_id)s::bigint)
               OR (%(search_recipient)s::text IS NOT NULL
                   AND evq_recipient_keys(b.payload) @> ARRAY[%(search_recipient)s::text])
               OR b.id = (SELECT k.id FROM step_keys k
                       WHERE k.message_id = %(search_message_id)s::text AND k.pruned_at IS NULL)
               OR b.provider_message_id = %(search)s::text
               OR b.idempotency_key = %(search)s::text
               OR b.run_id = %(search)s::text)
          UNION
          SELECT k.id, k.status FROM keyed k WHERE k.status <> 'accepted') u
    GROUP BY 1
    UNION ALL
    SELECT 'accepted', count(*)::int
    FROM ((SELECT b.id
           FROM base b
           WHERE %(search)s::text IS NOT NULL
             AND b.status = 'accepted'
             AND ((%(search_id)s::bigint IS NOT NULL AND b.id = %(search_id)s::bigint)
               OR (%(search_recipient)s::text IS NOT NULL
                   AND evq_recipient_keys(b.payload) @> ARRAY[%(search_recipient)s::text])
               OR b.id = (SELECT k.id FROM step_keys k
                       WHERE k.message_id = %(search_message_id)s::text AND k.pruned_at IS NULL)
               OR b.provider_message_id = %(search)s::text
               OR b.idempotency_key = %(search)s::text
               OR b.run_id = %(search)s::text)
           LIMIT %(count_cap)s::int + 1)
          UNION
          (SELECT k.id FROM keyed k WHERE k.status = 'accepted' LIMIT %(count_cap)s::int + 1)) a
)
SELECT c.status, least(c.n, %(count_cap)s::int + 1) AS n
FROM (VALUES
    ('held', (SELECT count(*)::int FROM (SELECT 1 FROM base b WHERE b.status = 'held'
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'held'), 0)),
    ('pending', (SELECT count(*)::int FROM (SELECT 1 FROM base b WHERE b.status = 'pending'
                 AND NOT EXISTS (SELECT 1 FROM step_queue q WHERE q.id = b.id AND q.lease_token IS NOT NULL)
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'pending'), 0)),
    ('in_flight', (SELECT count(*)::int FROM (SELECT 1 FROM step_queue q JOIN base b ON b.id = q.id
                 WHERE q.lease_token IS NOT NULL
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'in_flight'), 0)),
    ('retryable', (SELECT count(*)::int FROM (SELECT 1 FROM base b WHERE b.status = 'retryable'
                 AND NOT EXISTS (SELECT 1 FROM step_queue q WHERE q.id = b.id AND q.lease_token IS NOT NULL)
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'retryable'), 0)),
    ('unknown', (SELECT count(*)::int FROM (SELECT 1 FROM base b WHERE b.status = 'unknown'
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'unknown'), 0)),
    ('accepted', (SELECT count(*)::int FROM (SELECT 1 FROM base b WHERE b.status = 'accepted'
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'accepted'), 0)),
    ('rejected', (SELECT count(*)::int FROM (SELECT 1 FROM base b WHERE b.status = 'rejected'
                 LIMIT CASE WHEN %(search)s::text IS NULL THEN %(count_cap)s::int + 1 ELSE 0 END) c)
             + coalesce((SELECT f.n FROM searched f WHERE f.status = 'rejected'), 0))
) AS c(status, n);


-- name: step_subject_scan
-- The subject filter (docs/design.md, "Search by subject"): the steps whose request's subject
-- holds %(subject)s (already lower-cased) in any case, on top of step_list's other filters,
-- its states and its search. No index answers a substring, and none is added for it (an index
-- on email_steps, the hot table, costs every send a write): `scanned` reads the newest
-- %(scan_cap)s steps the other filters leave (newest first by id: the primary key read
-- backwards, or a filter's own index and a sort of its rows, whichever the planner finds
-- cheaper) and matches the subject in those only. A scanned count of scan_cap means older
-- steps were not searched, and the page says so ("searched the newest N steps"); the step's
-- row is read for its subject (its payload, TOASTed when large) once per scanned step.
-- The page is the hits newest first (every state, unknown and held too: a subject search
-- is a look-up, not a queue); `by_status` counts the hits of each state (the tabs).
-- The search's arms are step_list's, tested row by row here (each is cheap: the Message-ID's
-- ledger look-up and the key name's decisions are read once, as init plans).
-- One row always comes back: it carries the counts, and no step when the page is empty.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), scanned AS MATERIALIZED (
    -- In flight: a lease on the queue row (a pending or retryable step's only).
    SELECT s.id, CASE WHEN s.status IN ('pending', 'retryable') THEN CASE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id = s.id AND q.lease_token IS NOT NULL) THEN 'in_flight' ELSE s.status END ELSE s.status END AS status,
           strpos(lower(s.payload ->> 'subject'), %(subject)s::text) > 0 AS hit
    FROM email_steps s
    WHERE (%(ids)s::bigint[] IS NULL OR s.id = ANY(%(ids)s::bigint[]))
      AND (%(statuses)s::text[] IS NULL OR CASE WHEN s.status IN ('pending', 'retryable') THEN CASE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id = s.id AND q.lease_token IS NOT NULL) THEN 'in_flight' ELSE s.status END ELSE s.status END = ANY(%(statuses)s::text[]))
      AND (%(run_id)s::text IS NULL OR s.run_id = %(run_id)s)
      AND (%(provider)s::text IS NULL OR s.provider = %(provider)s)
      AND (%(created_before)s::timestamptz IS NULL
           OR coalesce(s.unknown_since, s.created_at) < %(created_before)s::timestamptz)
      AND (%(recipient_domain)s::text IS NULL
           OR evq_recipient_keys(s.payload) @> ARRAY['@' || lower(%(recipient_domain)s::text)])
      AND (%(search)s::text IS NULL
           OR (%(search_id)s::bigint IS NOT NULL AND s.id = %(search_id)s::bigint)
           OR (%(search_recipient)s::text IS NOT NULL
               AND evq_recipient_keys(s.payload) @> ARRAY[%(search_recipient)s::text])
           OR s.id = (SELECT k.id FROM step_keys k
                      WHERE k.message_id = %(search_message_id)s::text AND k.pruned_at IS NULL)
           OR s.provider_message_id = %(search)s::text
           OR s.idempotency_key = %(search)s::text
           OR s.run_id = %(search)s::text
           OR s.decision_id = ANY(ARRAY(SELECT d.id FROM decisions d WHERE d.actor = %(search)s::text)))
    ORDER BY s.id DESC
    LIMIT %(scan_cap)s::int
), counted AS (
    SELECT (SELECT count(*)::int FROM scanned) AS scanned,
           coalesce((SELECT jsonb_object_agg(c.status, c.n)
                     FROM (SELECT h.status, count(*)::int AS n FROM scanned h WHERE h.hit GROUP BY h.status) c),
                    '{}'::jsonb) AS by_status
), page AS (
    SELECT h.id FROM scanned h WHERE h.hit ORDER BY h.id DESC LIMIT %(limit)s OFFSET %(offset)s
)
SELECT c.scanned, c.by_status,
       s.id, s.run_id, s.step_id, s.status, s.reason, s.provider, s.attempts,
       ARRAY(SELECT r ->> 'email'
             FROM jsonb_array_elements(s.payload -> 'to') r
             UNION ALL SELECT r ->> 'email' FROM jsonb_array_elements(s.payload -> 'cc') r
             UNION ALL SELECT r ->> 'email' FROM jsonb_array_elements(s.payload -> 'bcc') r) AS recipients,
       s.payload ->> 'subject' AS subject,
       s.created_at, s.updated_at, s.unknown_since, s.closed_at, s.maybe_delivered,
       extract(epoch FROM t.now - coalesce(s.unknown_since, s.created_at))::float8 AS age_seconds
FROM counted c
CROSS JOIN t
LEFT JOIN (page JOIN steps_now s ON s.id = page.id) ON true
ORDER BY s.id DESC;


-- name: step_resolve
-- An operator's verdict on an unknown row: the close and its operator_resolved
-- evidence (who, note, reason, reference, the state it replaced) in one statement,
-- guarded by status = 'unknown'. FOR UPDATE reads the row as committed after any
-- concurrent close: a second operator waits for the first, then finds the row no
-- longer unknown, changes nothing and gets the state it is in (E_CONFLICT).
-- 'retryable' is "verified not sent": the same key and Message-ID go out again;
-- maybe_delivered is cleared (the operator checked), and a row whose attempts are
-- spent is given one more (recorded in the evidence).
-- A row the rescuer took (reason lease_expired) may still have its attempt going out
-- from a paused or slow worker: 'retryable' waits until that attempt's lease plus the
-- adapter's whole deadline (deadline_share of the lease, counted from its start) has
-- passed, on this database's clock (retry_not_before; NULL: no wait).
-- The dead-letter requeue: 'retryable' is also taken for a rejected row whose
-- attempts or retry budget ran out on temporary failures only (no attempt may have
-- been delivered: maybe_delivered is false, else it would have ended unknown). It
-- goes back with a fresh budget (retry_from = now) and its attempts forgiven.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    -- A step under an attempt is shown as in flight (its queue row's lease): never unknown.
    SELECT s.id, s.run_id,
           CASE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id = s.id AND q.lease_token IS NOT NULL)
                THEN 'in_flight' ELSE s.status END AS status,
           s.reason, s.detail, s.attempts, s.max_attempts, s.unknown_since,
           s.provider_message_id, s.closed_at, s.updated_at, s.created_at,
           CASE WHEN s.reason = 'lease_expired' THEN (
               SELECT x.expired + (x.expired - x.started) * %(deadline_share)s::float8
               FROM (SELECT (le.detail ->> 'lease_expired_at')::timestamptz AS expired,
                            (SELECT max(a.created_at) FROM evidence a
                             WHERE a.step_id = le.step_id AND a.attempt = le.attempt
                               AND a.kind = 'attempt_started' AND a.id < le.id) AS started
                     FROM evidence le
                     WHERE le.step_id = s.id AND le.kind = 'lease_expired' AND le.attempt = s.attempts
                     ORDER BY le.id DESC LIMIT 1) x
           ) END AS retry_not_before,
           -- A step whose body retention removed (content_redacted_at) is never sent again.
           (s.status = 'rejected' AND s.reason IN ('attempts_exhausted', 'retry_budget_exhausted')
            AND NOT s.maybe_delivered AND s.content_redacted_at IS NULL) AS requeueable,
           s.content_redacted_at,
           -- The provider's own answer that it took this message for some recipients (an
           -- SMTP transaction accepted before a later one's reply was lost, split by a
           -- 452; an accepted answer that came too late to close the row): a retry would
           -- send it to them again, whatever an operator verified, so it is refused.
           (SELECT max(e.id) FROM evidence e
            WHERE e.step_id = s.id AND e.kind IN ('provider_response', 'late_response')
              AND (e.outcome = 'accepted'
                   OR (jsonb_typeof(e.detail -> 'accepted') = 'number' AND (e.detail ->> 'accepted')::numeric > 0))
           ) AS accepted_evidence,
           s.attempts - s.uncharged_attempts AS charged_attempts, s.retry_from
    FROM email_steps s
    WHERE s.id = %(id)s
    FOR UPDATE
), closed AS (
    UPDATE email_steps s
    SET status = %(to_status)s,
        reason = 'operator',
        detail = %(note)s,
        provider_message_id = CASE WHEN %(to_status)s = 'accepted'
                                   THEN coalesce(%(provider_message_id)s, s.provider_message_id)
                                   ELSE s.provider_message_id END,
        maybe_delivered = CASE WHEN %(to_status)s = 'retryable' THEN false ELSE s.maybe_delivered END,
        max_attempts = CASE WHEN %(to_status)s = 'retryable' AND NOT cur.requeueable
                                 AND cur.charged_attempts >= coalesce(s.max_attempts, %(default_max_attempts)s)
                            THEN cur.charged_attempts + 1 ELSE s.max_attempts END,
        -- A requeue forgives the spent attempts (the count itself stays: it numbers the
        -- evidence) and restarts the retry budget: the step gets what a new one would.
        uncharged_attempts = CASE WHEN cur.requeueable THEN s.attempts ELSE s.uncharged_attempts END,
        retry_from = CASE WHEN cur.requeueable THEN t.now ELSE s.retry_from END,
        next_attempt_at = CASE WHEN %(to_status)s = 'retryable' THEN t.now ELSE s.next_attempt_at END,
        unknown_since = NULL,
        closed_at = CASE WHEN %(to_status)s IN ('accepted', 'rejected') THEN t.now END,
        updated_at = t.now
    FROM cur, t
    WHERE s.id = cur.id
      AND NOT (%(to_status)s = 'retryable' AND cur.accepted_evidence IS NOT NULL)
      AND ((cur.status = 'unknown'
            AND NOT (%(to_status)s = 'retryable' AND coalesce(cur.retry_not_before > t.now, false)))
           OR (cur.requeueable AND %(to_status)s = 'retryable'))
    RETURNING s.id, s.run_id, s.status, s.attempts, s.max_attempts, s.uncharged_attempts, s.provider, s.closed_at,
              t.now AS at, s.priority, s.next_attempt_at, s.first_attempt_at, s.dedupe_until, s.maybe_delivered
), queued AS (
    -- Back in the queue, with the counters the step has.
    INSERT INTO step_queue (id, provider, priority, next_attempt_at, attempts, first_attempt_at, dedupe_until,
                            maybe_delivered)
    SELECT c.id, c.provider, c.priority, c.next_attempt_at, c.attempts, c.first_attempt_at, c.dedupe_until,
           c.maybe_delivered
    FROM closed c
    WHERE c.status = 'retryable'
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason,
                          provider_message_id, detail, created_at)
    SELECT c.id, c.run_id, c.attempts, 'operator_resolved', %(actor)s, cur.status, c.status,
           coalesce(%(reason)s, 'operator'), %(provider_message_id)s,
           jsonb_build_object(
               'verdict', %(verdict)s::text,
               'note', %(note)s::text,
               'reference', jsonb_build_object('provider_message_id', %(provider_message_id)s::text,
                                               'evidence_url', %(evidence_url)s::text),
               'previous', jsonb_build_object('status', cur.status, 'reason', cur.reason, 'detail', cur.detail,
                                              'unknown_since', cur.unknown_since, 'attempts', cur.attempts,
                                              'max_attempts', cur.max_attempts,
                                              'provider_message_id', cur.provider_message_id),
               'max_attempts_raised', c.max_attempts IS DISTINCT FROM cur.max_attempts,
               'max_attempts', c.max_attempts,
               'requeued', cur.requeueable,
               'uncharged_attempts', c.uncharged_attempts,
               'retry_from', CASE WHEN cur.requeueable THEN c.at END),
           c.at
    FROM closed c, cur
    RETURNING id, created_at
)
SELECT cur.id, cur.run_id, cur.created_at, cur.status AS current_status, cur.reason AS current_reason,
       cur.closed_at AS current_closed_at, closed.status AS to_status, closed.attempts,
       cur.max_attempts AS max_attempts_before, closed.max_attempts AS max_attempts_after,
       closed.closed_at, ev.id AS evidence_id, ev.created_at AS resolved_at,
       CASE WHEN closed.status = 'retryable' THEN pg_notify('evq_steps', closed.provider)::text IS NULL
            ELSE false END AS woke,
       cur.retry_not_before, (SELECT now FROM t) AS db_now, cur.requeueable, cur.accepted_evidence,
       cur.content_redacted_at
FROM cur
LEFT JOIN closed ON true
LEFT JOIN ev ON true;


-- name: step_approve
-- A person's approval of a held send (issue 17): held -> pending, reason approved, the
-- same key and Message-ID, and its `approved` evidence (the approver, their note, both
-- hashes) in one statement guarded by status = 'held' (FOR UPDATE: a second approver, or
-- the expiry pass, waits and then finds it no longer held: E_CONFLICT). With a correction
-- (%(payload)s, validated by the caller as at enqueue) the payload and its hash change and
-- requested_sha256 keeps the agent's own hash (the step guard allows exactly this);
-- the guard on %(from_sha256)s refuses a correction of a payload changed since it was read.
-- It is due at once, or at send_at when that is later, and its retry budget (EVQ_RETRY_FOR)
-- starts then, as an operator's requeue restarts it (step_resolve): the days it waited for a
-- person are not the provider's, and a greylisting 451 on first contact must still be retried.
-- Its recipients become known to the sender (address and @domain), so the first-contact rule
-- does not hold the next send to them.
-- A second person decides: the key that enqueued the step (its decision's actor_key_id) never
-- approves it (`asked`), whichever interface asked (ops/app/approvals.py refuses it first).
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    SELECT s.id, s.run_id, s.status, s.reason, s.payload_sha256, s.requested_sha256, s.held_since,
           s.hold_expires_at, s.hold,
           coalesce((SELECT d.actor_key_id = %(actor_key_id)s::text FROM decisions d WHERE d.id = s.decision_id),
                    false) AS asked
    FROM email_steps s
    WHERE s.id = %(id)s
    FOR UPDATE
), done AS (
    UPDATE email_steps s
    SET status = 'pending',
        reason = 'approved',
        detail = %(note)s,
        payload = coalesce(%(payload)s::jsonb, s.payload),
        payload_sha256 = coalesce(%(payload_sha256)s, s.payload_sha256),
        requested_sha256 = CASE WHEN %(payload_sha256)s::text IS NOT NULL AND %(payload_sha256)s <> s.payload_sha256
                                THEN coalesce(s.requested_sha256, s.payload_sha256)
                                ELSE s.requested_sha256 END,
        held_since = NULL,
        hold_expires_at = NULL,
        next_attempt_at = greatest(coalesce(s.send_at, t.now), t.now),
        retry_from = greatest(coalesce(s.send_at, t.now), t.now),
        updated_at = t.now
    FROM cur, t
    WHERE s.id = cur.id AND cur.status = 'held' AND NOT cur.asked
      AND (%(from_sha256)s::text IS NULL OR cur.payload_sha256 = %(from_sha256)s)
    RETURNING s.id, s.run_id, s.attempts, s.provider, s.payload, s.payload_sha256, s.requested_sha256, t.now AS at,
              s.priority, s.next_attempt_at
), queued AS (
    INSERT INTO step_queue (id, provider, priority, next_attempt_at)
    SELECT d.id, d.provider, d.priority, d.next_attempt_at FROM done d
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, detail, created_at)
    SELECT d.id, d.run_id, d.attempts, 'approved', %(actor)s, 'held', 'pending', 'approved',
           jsonb_build_object(
               'note', %(note)s::text,
               'edited', d.payload_sha256 <> cur.payload_sha256,
               'from_sha256', cur.payload_sha256,
               'to_sha256', d.payload_sha256,
               'fields', %(fields)s::jsonb,
               'held_since', cur.held_since,
               'hold_expires_at', cur.hold_expires_at,
               'hold', cur.hold),
           d.at
    FROM done d, cur
    RETURNING id, created_at
), known AS (
    INSERT INTO known_recipients (sender, recipient, first_step_id, created_at)
    SELECT DISTINCT lower(d.payload -> 'from' ->> 'email'), k.recipient, d.id, d.at
    FROM done d
    CROSS JOIN LATERAL jsonb_array_elements((d.payload -> 'to') || (d.payload -> 'cc') || (d.payload -> 'bcc')) r
    CROSS JOIN LATERAL (VALUES (lower(r ->> 'email')), ('@' || lower(split_part(r ->> 'email', '@', 2)))) k(recipient)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT cur.id, cur.run_id, cur.status AS current_status, cur.reason AS current_reason,
       cur.payload_sha256 AS current_sha256, cur.asked, done.id IS NOT NULL AS changed, done.payload_sha256,
       done.requested_sha256, ev.id AS evidence_id, ev.created_at AS decided_at,
       CASE WHEN done.id IS NOT NULL THEN pg_notify('evq_steps', done.provider)::text IS NULL
            ELSE false END AS woke,
       (SELECT count(*) FROM known) AS learned
FROM cur
LEFT JOIN done ON true
LEFT JOIN ev ON true;


-- name: step_deny
-- A person's denial of a held send: held -> rejected, reason denied, closed, with its
-- `denied` evidence, in one statement guarded by status = 'held'. The caller enqueues
-- the notice to `notify` in the same transaction (notice_candidates); the key_events
-- trigger puts the rejection in the enqueuing key's feed.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), cur AS (
    SELECT s.id, s.run_id, s.status, s.reason, s.payload_sha256, s.held_since, s.hold_expires_at, s.hold
    FROM email_steps s
    WHERE s.id = %(id)s
    FOR UPDATE
), done AS (
    UPDATE email_steps s
    SET status = 'rejected', reason = 'denied', detail = %(note)s, held_since = NULL, hold_expires_at = NULL,
        closed_at = t.now, updated_at = t.now
    FROM cur, t
    WHERE s.id = cur.id AND cur.status = 'held'
    RETURNING s.id, s.run_id, s.attempts, s.payload_sha256, s.created_at, t.now AS at
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, detail, created_at)
    SELECT d.id, d.run_id, d.attempts, 'denied', %(actor)s, 'held', 'rejected', 'denied',
           jsonb_build_object('note', %(note)s::text, 'held_since', cur.held_since,
                              'hold_expires_at', cur.hold_expires_at, 'hold', cur.hold),
           d.at
    FROM done d, cur
    RETURNING id, created_at
)
SELECT cur.id, cur.run_id, cur.status AS current_status, cur.reason AS current_reason,
       done.id IS NOT NULL AS changed, cur.payload_sha256, done.created_at, ev.id AS evidence_id,
       ev.created_at AS decided_at
FROM cur
LEFT JOIN done ON true
LEFT JOIN ev ON true;


-- name: step_cancel
-- The agent's (or an operator's) cancel of a send not yet sent: held, pending, or
-- retryable that cannot have been delivered (maybe_delivered false) -> rejected, reason
-- cancelled, with its `cancelled` evidence, in one statement. FOR UPDATE waits for a
-- claim under way: a step a worker claimed first is in_flight and is left alone (the
-- caller says so); the claim's SKIP LOCKED passes over a row this statement holds, so a
-- cancelled step is never claimed.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), queued AS MATERIALIZED (
    -- The queue row first, as every writer locks it: it waits for a claim under way.
    SELECT q.id, q.lease_token IS NOT NULL AS leased, q.attempts, q.maybe_delivered
    FROM step_queue q
    WHERE q.id = %(id)s
    FOR UPDATE
), cur AS (
    SELECT s.id, s.run_id,
           CASE WHEN coalesce((SELECT q.leased FROM queued q), false) THEN 'in_flight' ELSE s.status END AS status,
           s.reason, s.payload_sha256,
           coalesce((SELECT q.maybe_delivered FROM queued q), s.maybe_delivered) AS maybe_delivered,
           coalesce((SELECT q.attempts FROM queued q), s.attempts) AS attempts, s.held_since,
           -- Put back in the queue after this statement's snapshot (an approval, an operator's
           -- requeue: FOR UPDATE reads the row as they left it): its queue row is one this
           -- statement can neither see nor lock, and a worker may already have claimed it (the
           -- claim reads email_steps unlocked). Nothing is changed; the caller runs the cancel
           -- again, whose new snapshot sees the queue row and locks it first.
           (s.status IN ('pending', 'retryable') AND NOT EXISTS (SELECT 1 FROM queued)
            AND NOT EXISTS (SELECT 1 FROM email_steps s0
                            WHERE s0.id = s.id AND s0.status IN ('pending', 'retryable'))) AS requeued_meanwhile
    FROM email_steps s
    WHERE s.id = %(id)s
    FOR UPDATE
), dequeued AS (
    DELETE FROM step_queue q
    USING cur
    WHERE q.id = cur.id AND cur.status IN ('pending', 'retryable') AND NOT cur.maybe_delivered
      AND NOT cur.requeued_meanwhile
), done AS (
    UPDATE email_steps s
    SET status = 'rejected', reason = 'cancelled', detail = %(note)s, held_since = NULL, hold_expires_at = NULL,
        closed_at = t.now, updated_at = t.now
    FROM cur, t
    WHERE s.id = cur.id AND cur.status IN ('held', 'pending', 'retryable') AND NOT cur.maybe_delivered
      AND NOT cur.requeued_meanwhile
    RETURNING s.id, s.run_id, s.attempts, s.created_at, t.now AS at
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, detail, created_at)
    SELECT d.id, d.run_id, d.attempts, 'cancelled', %(actor)s, cur.status, 'rejected', 'cancelled',
           jsonb_build_object('note', %(note)s::text, 'previous', jsonb_build_object(
               'status', cur.status, 'reason', cur.reason, 'attempts', cur.attempts, 'held_since', cur.held_since)),
           d.at
    FROM done d, cur
    RETURNING id, created_at
)
SELECT cur.id, cur.run_id, cur.status AS current_status, cur.reason AS current_reason,
       cur.maybe_delivered, done.id IS NOT NULL AS changed, cur.payload_sha256, done.created_at,
       ev.id AS evidence_id, ev.created_at AS decided_at, cur.requeued_meanwhile
FROM cur
LEFT JOIN done ON true
LEFT JOIN ev ON true;


-- name: steps_expire_held
-- The worker's expiry pass (worker/approval_actions.py): held sends past hold_expires_at ->
-- rejected, reason approval_expired, with `hold_expired` evidence, a batch at a time;
-- SKIP LOCKED keeps two workers (and an approver holding a row) apart. The caller
-- enqueues their notices in the same transaction.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), due AS (
    SELECT s.id, s.held_since, s.hold_expires_at
    FROM email_steps s, t
    WHERE s.status = 'held' AND s.hold_expires_at <= t.now
    ORDER BY s.hold_expires_at, s.id
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), done AS (
    UPDATE email_steps s
    SET status = 'rejected', reason = 'approval_expired', detail = 'no one approved it before it expired',
        held_since = NULL, hold_expires_at = NULL, closed_at = t.now, updated_at = t.now
    FROM due, t
    WHERE s.id = due.id AND s.status = 'held'
    RETURNING s.id, s.run_id, s.attempts, s.created_at, due.held_since, due.hold_expires_at, t.now AS at
), ev AS (
    INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, reason, detail, created_at)
    SELECT d.id, d.run_id, d.attempts, 'hold_expired', %(actor)s, 'held', 'rejected', 'approval_expired',
           jsonb_build_object('message', 'no one approved it before it expired',
                              'held_since', d.held_since, 'hold_expires_at', d.hold_expires_at),
           d.at
    FROM done d
    RETURNING step_id
)
SELECT d.id, d.created_at, d.at FROM done d JOIN ev ON ev.step_id = d.id;


-- name: isolation_default
-- The isolation level evq's transactions start in on this connection, and where it was set
-- (default_transaction_isolation's source: postgresql.conf, the database, the role, the
-- connection's options, a session's SET): adapters/postgres/isolation.py.
SELECT current_setting('transaction_isolation') AS level,
       (SELECT s.source FROM pg_settings s WHERE s.name = 'default_transaction_isolation') AS source,
       current_user AS role,
       current_database() AS database;

-- name: snapshot_read
-- The statements after this one in the same transaction read one snapshot, so a
-- run's steps, decisions and evidence agree with each other.
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;


-- name: run_step_count
-- How many steps a run has, counted up to %(count_cap)s + 1 (as step_list's totals) from
-- the run's unique key (run_id, step_id), its index alone when the rows are visible.
SELECT count(*)::int AS n
FROM (SELECT 1 FROM email_steps s WHERE s.run_id = %(run_id)s LIMIT %(count_cap)s::int + 1) AS r;


-- name: run_steps
-- One page of a run's steps (runs show, the ops page's trace), in step_id order: the run's
-- unique key is the index the page is read from, so a page costs its offset's index entries
-- and its own rows whatever the run's size. Creation order would sort the whole run first
-- (one enqueue_many gives every step one created_at). The page's step ids are picked first,
-- so a skipped step's row is not read. Its decisions and evidence are read by the page's
-- ids (decisions_get, evidence_for_steps): evidence keeps no index on run_id (every row would
-- pay for it).
SELECT s.*
FROM (SELECT p.step_id
      FROM email_steps p
      WHERE p.run_id = %(run_id)s
      ORDER BY p.step_id
      LIMIT %(limit)s OFFSET %(offset)s) AS page
JOIN steps_now s ON s.run_id = %(run_id)s AND s.step_id = page.step_id
ORDER BY s.step_id;


-- name: api_key_lock
-- Key changes are serialized: the bootstrap check ("no admin key yet") and the
-- last-admin check then read a state nobody else is changing. Held to commit.
SELECT pg_advisory_xact_lock(hashtext('evq.api_keys'));


-- name: api_key_create
-- A bootstrap create (no key presented) happens only while no active admin key
-- exists; run after api_key_lock in the same transaction, so two bootstraps at
-- once make one key. A name already taken (even by a revoked key) gives no row.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), guard AS (
    SELECT NOT %(bootstrap)s
           OR NOT EXISTS (SELECT 1 FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL) AS allowed
), created AS (
    INSERT INTO api_keys (name, role, key_id, secret_hash, created_at, created_by, notify_email, notify_url, approval)
    SELECT %(name)s, %(role)s, %(key_id)s, %(secret_hash)s, t.now, %(created_by)s, %(notify_email)s, %(notify_url)s,
           %(approval)s
    FROM guard, t
    WHERE guard.allowed
    ON CONFLICT DO NOTHING
    RETURNING name, role, key_id, created_at, created_by, notify_email, notify_url, approval
)
SELECT guard.allowed, created.*
FROM guard LEFT JOIN created ON true;


-- name: api_key_revoke
-- Takes effect at once: every check reads revoked_at. The last active admin key
-- is never revoked (nobody could manage keys afterwards); make another one first.
-- Run after api_key_lock. No row back: there is no key of that name.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), target AS (
    SELECT k.id, k.name, k.role, k.key_id, k.created_at, k.created_by, k.revoked_at, k.revoked_by, k.notify_email,
           k.notify_url, k.approval
    FROM api_keys k
    WHERE k.name = %(name)s
), other_admins AS (
    SELECT count(*)::int AS n FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL AND name <> %(name)s
), revoked AS (
    UPDATE api_keys k
    SET revoked_at = t.now, revoked_by = %(actor)s
    FROM target, other_admins, t
    WHERE k.id = target.id AND k.revoked_at IS NULL
      AND (k.role <> 'admin' OR other_admins.n > 0)
    RETURNING k.revoked_at, k.revoked_by
)
SELECT target.name, target.role, target.key_id, target.created_at, target.created_by, target.notify_email,
       target.notify_url, target.approval,
       coalesce(revoked.revoked_at, target.revoked_at) AS revoked_at,
       coalesce(revoked.revoked_by, target.revoked_by) AS revoked_by,
       revoked.revoked_at IS NOT NULL AS changed,
       target.revoked_at IS NOT NULL AS already_revoked,
       other_admins.n AS other_admins
FROM target CROSS JOIN other_admins LEFT JOIN revoked ON true;


-- name: api_key_by_id
-- The key and the server's pepper in one round trip; the pepper's row is always there,
-- so a known and an unknown id cost the same statement. The approval goes with the
-- identity to what the key enqueues (worker/approval_policy.py): read at every call, never cached.
SELECT k.name, k.role, k.secret_hash, k.revoked_at, k.session_generation, k.approval, p.pepper
FROM api_key_pepper p
LEFT JOIN api_keys k ON k.key_id = %(key_id)s
WHERE p.id = 1;


-- name: api_key_pepper
SELECT pepper FROM api_key_pepper WHERE id = 1;


-- name: wire_keys_from
-- The first step id whose HTTP idempotency key is keyed by a secret derived from the pepper
-- (adapters/http/provider.py::WireKeys); the steps before keep the key they may
-- already have been sent under.
SELECT wire_keys_from FROM api_key_pepper WHERE id = 1;


-- name: api_key_rehash
-- A legacy (scrypt) hash replaced by its HMAC after a successful check; guarded by the
-- old hash, so two servers rehashing at once write the same value once.
UPDATE api_keys SET secret_hash = %(new)s
WHERE key_id = %(key_id)s AND secret_hash = %(old)s;


-- name: api_key_end_sessions
-- Signing out of the ops page: every session made under the current generation of
-- this key is refused from the next request on (ops/web/page.py checks it each time).
UPDATE api_keys SET session_generation = session_generation + 1
WHERE key_id = %(key_id)s AND session_generation = %(generation)s;


-- name: api_key_state
-- What creating a key would meet (for --dry-run): is there an admin key, is the name taken.
SELECT EXISTS (SELECT 1 FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL) AS admin_exists,
       EXISTS (SELECT 1 FROM api_keys WHERE name = %(name)s) AS name_taken;


-- name: key_events_of_key
-- A page of one key's feed after a cursor (OFFSET, LIMIT), by its id or its name: the
-- (key_id, id) index walks exactly that key's events from the cursor on. key_events_count_of_key,
-- in the same snapshot, is its total.
SELECT e.*, k.name AS key_name
FROM key_events e
LEFT JOIN api_keys k ON k.key_id = e.key_id
WHERE e.key_id = coalesce(%(key_id)s, (SELECT key_id FROM api_keys WHERE name = %(key_name)s))
  AND e.id > %(since)s
ORDER BY e.id
OFFSET %(offset)s
LIMIT %(limit)s;


-- name: key_events_count_of_key
-- How many events one key's feed has after the cursor, counted up to %(count_cap)s + 1 on the
-- (key_id, id) index.
SELECT count(*)::int AS n
FROM (SELECT 1 FROM key_events e
      WHERE e.key_id = coalesce(%(key_id)s, (SELECT key_id FROM api_keys WHERE name = %(key_name)s))
        AND e.id > %(since)s
      LIMIT %(count_cap)s::int + 1) AS c;


-- name: key_events_all
-- A page of every key's feed (and of steps enqueued without a key), for an operator.
SELECT e.*, k.name AS key_name
FROM key_events e
LEFT JOIN api_keys k ON k.key_id = e.key_id
WHERE e.id > %(since)s
ORDER BY e.id
OFFSET %(offset)s
LIMIT %(limit)s;


-- name: key_events_count_all
-- How many events every key's feed has after the cursor, counted up to %(count_cap)s + 1.
SELECT count(*)::int AS n
FROM (SELECT 1 FROM key_events e WHERE e.id > %(since)s LIMIT %(count_cap)s::int + 1) AS c;


-- name: api_key_set_notify
-- A key's default notification target (NULL: none). A revoked key keeps its own.
UPDATE api_keys
SET notify_email = %(notify_email)s
WHERE name = %(name)s
RETURNING name, role, key_id, created_at, created_by, revoked_at, revoked_by, notify_email, notify_url, approval;


-- name: api_key_set_approval
-- Whether a key's sends wait for a person (0030): always, policy or never. Read with the key
-- at its next call, so it applies from the next enqueue on; what it held stays held.
UPDATE api_keys
SET approval = %(approval)s
WHERE name = %(name)s
RETURNING name, role, key_id, created_at, created_by, revoked_at, revoked_by, notify_email, notify_url, approval;


-- name: api_key_list
SELECT name, role, key_id, created_at, created_by, revoked_at, revoked_by, notify_email, notify_url, approval
FROM api_keys
ORDER BY created_at, id;


-- name: prune_cutoff
-- Retention is measured on the database's clock, never the client's: a client whose
-- clock runs ahead would otherwise remove history closed moments ago.
SELECT now() - %(older_than)s::interval AS cutoff;


-- name: steps_prune
-- One batch of retention, in the caller's transaction: evq_prune_batch
-- (migrations/baseline/prune.sql) runs as the tables' owner, so the runtime role, which may not
-- delete history itself, can prune through it. It deletes terminal steps created
-- and closed before the cutoff with their evidence, decisions and failure notices,
-- never a step a notice that must stay points at, and writes the prune_log row.
SELECT pruned_steps AS steps, pruned_evidence AS evidence, pruned_decisions AS decisions
FROM evq_prune_batch(%(cutoff)s, %(limit)s, %(actor)s, %(run)s, %(batch)s);


-- name: evidence_seal
-- Retention's first step for a whole evidence partition (migrations/baseline/partitions.sql): the oldest one
-- starting above %(after)s whose steps all look closed before the cutoff, sealed (a
-- trigger refuses every new row) and committed. None when no partition is left to try.
SELECT partition_name AS name, range_lo AS lo, range_hi AS hi
FROM evq_evidence_seal(%(cutoff)s, %(after)s);


-- name: evidence_drop
-- A sealed partition dropped when every step of its range (and every notice of one) closed
-- before the cutoff, logged in prune_log; otherwise unsealed and `dropped` false.
SELECT dropped, rows_dropped AS evidence, range_lo AS lo, range_hi AS hi
FROM evq_evidence_drop(%(name)s, %(cutoff)s, %(actor)s, %(run)s, %(batch)s);


-- name: evidence_unseal
SELECT evq_evidence_unseal(%(name)s) AS unsealed;


-- name: evidence_partitions_ahead
-- Partitions of %(steps)s step ids until four lie beyond the newest step (worker/partitions.py).
SELECT evq_evidence_partitions_ahead(%(steps)s) AS made;


-- name: evidence_partitions
SELECT name, lo, hi, sealed FROM evq_evidence_partitions();


-- name: steps_prune_count
-- What steps_prune would remove (evq prune --dry-run), through the same predicate.
SELECT pruned_steps AS steps, pruned_evidence AS evidence, pruned_decisions AS decisions
FROM evq_prune_count(%(cutoff)s);


-- name: steps_redact
-- One batch of content retention (worker/content_retention.py): evq_redact_batch
-- (migrations/baseline/prune.sql) runs as the tables' owner, so the runtime role, which may
-- not change a payload itself, can redact through it. It replaces the text and html of
-- closed steps closed more than `keep` ago (the database's clock) with their sizes
-- and SHA-256, keeps everything else, and writes a content_redacted evidence row each.
SELECT redacted, first_step_id, last_step_id
FROM evq_redact_batch(%(keep)s::interval, %(limit)s, %(actor)s);


-- name: refusals_prune
-- Refused enqueues recorded before the cutoff (evq prune), a bounded batch at a time
-- through the created_at index. enqueue_refusal_counts keeps counting them.
WITH doomed AS (
    SELECT r.id FROM enqueue_refusals r WHERE r.created_at < %(cutoff)s ORDER BY r.created_at LIMIT %(limit)s
), gone AS (
    DELETE FROM enqueue_refusals r USING doomed d WHERE r.id = d.id RETURNING 1
)
SELECT count(*)::int AS refusals FROM gone;


-- name: refusals_prune_count
-- What refusals_prune would remove (evq prune --dry-run).
SELECT count(*)::int AS refusals FROM enqueue_refusals r WHERE r.created_at < %(cutoff)s;


-- name: budgets_prune
-- Blast-radius counters (send_budgets) whose window closed before the cutoff (evq prune):
-- an hour's or a day's window once it is over, a run's (one window, at the epoch) once the
-- run has no step left and nothing charged it since the cutoff. A budget this list does not
-- name is kept. A batch reads the next `limit` counters in key order after `after` (one pass
-- over the table, through its primary key) and deletes those that closed (with `dry`, only
-- counts them); `last_*` is where the next batch starts, NULL once the pass is done. A
-- counter anything wrote since it was read (its xmin moved: an enqueue that charged it and
-- committed while this statement waited for its lock) is kept, whatever `now` it charged at:
-- the check that its run has no step read a snapshot from before that commit. The windows'
-- lengths, in seconds, are worker/approval_policy.py's WINDOW_SECONDS (`windowed`, `seconds`).
WITH scanned AS (
    SELECT b.budget, b.scope, b.window_start, b.updated_at, b.xmin AS version
    FROM send_budgets b
    WHERE (b.budget, b.scope, b.window_start)
          > (%(after_budget)s::text, %(after_scope)s::text, %(after_window)s::timestamptz)
    ORDER BY b.budget, b.scope, b.window_start
    LIMIT %(limit)s
), closed AS (
    SELECT s.* FROM scanned s
    LEFT JOIN unnest(%(windowed)s::text[], %(seconds)s::float8[]) AS w(budget, seconds) ON w.budget = s.budget
    WHERE s.window_start + make_interval(secs => w.seconds) <= %(cutoff)s
       OR (s.budget = 'run_recipients' AND s.updated_at < %(cutoff)s
           AND NOT EXISTS (SELECT 1 FROM email_steps x WHERE x.run_id = s.scope))
), gone AS (
    DELETE FROM send_budgets b USING closed c
    WHERE NOT %(dry)s AND (b.budget, b.scope, b.window_start) = (c.budget, c.scope, c.window_start)
      AND b.xmin = c.version
    RETURNING 1
), last AS (
    SELECT s.budget, s.scope, s.window_start FROM scanned s
    ORDER BY s.budget DESC, s.scope DESC, s.window_start DESC LIMIT 1
)
SELECT CASE WHEN %(dry)s THEN (SELECT count(*) FROM closed) ELSE (SELECT count(*) FROM gone) END::int AS budgets,
       l.budget AS last_budget, l.scope AS last_scope, l.window_start AS last_window
FROM (SELECT 1) one LEFT JOIN last l ON true;


-- name: refusal_record
-- One refused enqueue (worker/refusals.py), in a short transaction of its own, with the
-- database-wide counter evq_enqueue_refusals_total: one increment per failing field's
-- root. The reasons arrive sorted, so concurrent refusals lock the counter rows in one
-- order and never deadlock.
WITH refusal AS (
    INSERT INTO enqueue_refusals (
        created_at, interface, key_name, dry_run, requests, request_bytes, request_sha256,
        errors, error_count, reasons, asked
    )
    VALUES (
        coalesce(%(now)s::timestamptz, now()), %(interface)s, %(key_name)s, %(dry_run)s, %(requests)s,
        %(request_bytes)s, %(request_sha256)s, %(errors)s::jsonb, %(error_count)s, %(reasons)s::text[],
        %(asked)s::jsonb
    )
    RETURNING id, created_at
), counted AS (
    INSERT INTO enqueue_refusal_counts (interface, field, total)
    SELECT %(interface)s, f.field, 1 FROM unnest(%(reasons)s::text[]) WITH ORDINALITY AS f(field, ord)
    ORDER BY f.ord
    ON CONFLICT (interface, field) DO UPDATE SET total = enqueue_refusal_counts.total + 1
)
SELECT id, created_at FROM refusal;


-- name: refusal_list
-- A page of refused enqueues newest first (OFFSET, LIMIT), optionally one key's or one
-- interface's, and only those at most %(before_id)s (paging: the last id seen less one).
-- refusal_count, in the same snapshot, is its total.
SELECT r.id, r.created_at, r.interface, r.key_name, r.dry_run, r.requests, r.request_bytes, r.request_sha256,
       r.errors, r.error_count, r.reasons, r.asked
FROM enqueue_refusals r
WHERE (%(key_name)s::text IS NULL OR r.key_name = %(key_name)s)
  AND (%(interface)s::text IS NULL OR r.interface = %(interface)s)
  AND (%(before_id)s::bigint IS NULL OR r.id <= %(before_id)s)
ORDER BY r.id DESC
OFFSET %(offset)s
LIMIT %(limit)s;


-- name: refusal_count
-- How many refusals refusal_list's filters match, counted up to %(count_cap)s + 1.
SELECT count(*)::int AS n
FROM (SELECT 1 FROM enqueue_refusals r
      WHERE (%(key_name)s::text IS NULL OR r.key_name = %(key_name)s)
        AND (%(interface)s::text IS NULL OR r.interface = %(interface)s)
        AND (%(before_id)s::bigint IS NULL OR r.id <= %(before_id)s)
      LIMIT %(count_cap)s::int + 1) AS c;


-- name: schema_revision
SELECT version_num FROM alembic_version;


-- name: queue_stats_timeout
-- Bounds the next statement of this transaction only (SET LOCAL), so it works
-- behind PgBouncer in transaction mode, where startup options do not.
SELECT set_config('statement_timeout', %(timeout_ms)s::text, true);


-- name: queue_stats
-- The metrics collector's one read at scrape time; each part is read from an index
-- whose size follows the live backlog, never the terminal history:
-- - queue lag and the waiting times of every row claimable now: the queue (step_queue,
--   whose rows are the live backlog; ix_step_queue_claimable leads with priority, so
--   the oldest due is the least over it, not its first entry);
-- - held rows and the oldest one's age: ix_email_steps_held;
-- - in flight and expired leases: the queue's leased rows (ix_step_queue_lease_expiry);
-- - unknown rows and their ages: ix_email_steps_unknown_since, index only;
-- - pending and retryable counts: their range of ix_email_steps_status_created_at, index only,
--   less the in-flight ones (email_steps keeps the state a step was claimed from).
-- Terminal states are counted the same way while the planner's estimate for them is
-- under %(exact_limit)s rows; above it the estimate is the answer (Oban Met's
-- estimate_limit), because an exact count of a million accepted rows would read a
-- million index entries on every scrape. The estimate is the one the planner makes
-- for `status = 'accepted'`: the value's frequency in pg_stats times reltuples,
-- scaled to the table's current size.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), lag AS (
    SELECT min(q.next_attempt_at) AS oldest_due
    FROM step_queue q
    WHERE q.lease_token IS NULL AND q.next_attempt_at <= (SELECT now FROM t)
), leased AS MATERIALIZED (
    SELECT s.status AS claimed_from, q.lease_expires_at < (SELECT now FROM t) AS expired
    FROM step_queue q JOIN email_steps s ON s.id = q.id
    WHERE q.lease_token IS NOT NULL
), in_flight AS (
    SELECT count(*) AS n, count(*) FILTER (WHERE l.expired) AS expired,
           count(*) FILTER (WHERE l.claimed_from = 'pending') AS from_pending,
           count(*) FILTER (WHERE l.claimed_from = 'retryable') AS from_retryable
    FROM leased l
), due AS MATERIALIZED (
    -- Rows claimable now and how long each has waited since it became due (the queue lag's rows).
    SELECT extract(epoch FROM (SELECT now FROM t) - q.next_attempt_at)::float8 AS age
    FROM step_queue q
    WHERE q.lease_token IS NULL AND q.next_attempt_at <= (SELECT now FROM t)
), due_buckets AS (
    SELECT array_agg(b.n ORDER BY b.le) AS counts
    FROM (
        SELECT le.le, count(d.age) AS n
        FROM unnest(%(pending_buckets)s::float8[]) AS le(le)
        LEFT JOIN due d ON d.age <= le.le
        GROUP BY le.le
    ) b
), unknown AS MATERIALIZED (
    SELECT extract(epoch FROM (SELECT now FROM t) - s.unknown_since)::float8 AS age
    FROM email_steps s
    WHERE s.status = 'unknown'
), unknown_buckets AS (
    -- Cumulative, as Prometheus buckets are: rows aged at most `le` seconds.
    SELECT array_agg(b.n ORDER BY b.le) AS counts
    FROM (
        SELECT le.le, count(u.age) AS n
        FROM unnest(%(buckets)s::float8[]) AS le(le)
        LEFT JOIN unknown u ON u.age <= le.le
        GROUP BY le.le
    ) b
), planner AS (
    SELECT v.status,
           coalesce((SELECT f.freq
                     FROM pg_stats ps,
                          unnest(ps.most_common_vals::text::text[], ps.most_common_freqs) AS f(val, freq)
                     WHERE ps.schemaname = n.nspname AND ps.tablename = c.relname AND ps.attname = 'status'
                       AND f.val = v.status), 0)
           * CASE WHEN c.relpages > 0 AND c.reltuples > 0
                  THEN c.reltuples / c.relpages * (pg_relation_size(c.oid) / current_setting('block_size')::float8)
                  ELSE 0 END AS rows
    FROM (VALUES ('accepted'), ('rejected')) AS v(status)
    CROSS JOIN pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = 'email_steps'::regclass
), terminal AS (
    SELECT p.status,
           p.rows >= %(exact_limit)s AS estimated,
           CASE WHEN p.rows >= %(exact_limit)s THEN round(p.rows)::bigint
                -- The constant list lets the planner prove the status index's predicate.
                ELSE (SELECT count(*) FROM email_steps s
                      WHERE s.status = p.status AND s.status IN ('accepted', 'rejected')) END AS n
    FROM planner p
)
SELECT (SELECT count(*) FROM email_steps s WHERE s.status = 'held') AS held,
       -- The approval queue's oldest (ix_email_steps_held: held rows only, oldest first).
       coalesce(extract(epoch FROM (SELECT now FROM t)
                - (SELECT min(s.held_since) FROM email_steps s WHERE s.status = 'held'))::float8, 0) AS held_oldest_age,
       (SELECT count(*) FROM email_steps s WHERE s.status = 'pending') - f.from_pending AS pending,
       (SELECT count(*) FROM email_steps s WHERE s.status = 'retryable') - f.from_retryable AS retryable,
       f.n AS in_flight, f.expired AS in_flight_expired,
       (SELECT count(*) FROM unknown) AS unknown,
       coalesce((SELECT max(age) FROM unknown), 0) AS unknown_oldest_age,
       coalesce((SELECT sum(age) FROM unknown), 0) AS unknown_age_sum,
       (SELECT counts FROM unknown_buckets) AS unknown_buckets,
       coalesce(extract(epoch FROM (SELECT now FROM t) - l.oldest_due)::float8, 0) AS pending_oldest_age,
       (SELECT count(*) FROM due) AS pending_due,
       coalesce((SELECT sum(age) FROM due), 0) AS pending_age_sum,
       (SELECT counts FROM due_buckets) AS pending_buckets,
       (SELECT n FROM terminal WHERE status = 'accepted') AS accepted,
       (SELECT n FROM terminal WHERE status = 'rejected') AS rejected,
       ARRAY(SELECT status FROM terminal WHERE estimated ORDER BY status) AS estimated,
       -- Providers' circuits (worker/circuit.py): a row per provider at most.
       (SELECT coalesce(jsonb_object_agg(c.provider, c.state), '{}'::jsonb) FROM provider_circuits c) AS circuits,
       -- Refused enqueues ever recorded, by interface and field (enqueue_refusal_counts: a row per pair).
       (SELECT coalesce(jsonb_agg(jsonb_build_array(r.interface, r.field, r.total)), '[]'::jsonb)
        FROM enqueue_refusal_counts r) AS refusals,
       -- Evidence partitions starting above the newest step id handed out: the keeper keeps
       -- four. Read from the catalog by their names (evidence_steps_<lo>, as the keeper names
       -- them), so no partition is opened or locked however many there are.
       (SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'evidence'::regclass AND c.relname ~ '^evidence_steps_[0-9]+$'
          AND substr(c.relname, 16)::numeric
              > coalesce(pg_sequence_last_value(pg_get_serial_sequence('email_steps', 'id')::regclass), 0)
       ) AS evidence_partitions_ahead,
       -- Rows the overflow partition holds (evidence no partition covered when it was written), from
       -- the statistics: the runtime role may not read a partition, and they need no scan. The larger
       -- of the live count and the last ANALYZE's, since a crash resets the first.
       (SELECT greatest(coalesce(st.n_live_tup, 0), c.reltuples, 0)::bigint
        FROM pg_class c LEFT JOIN pg_stat_user_tables st ON st.relid = c.oid
        WHERE c.oid = to_regclass('evidence_overflow')) AS evidence_overflow_rows
FROM lag l, in_flight f;


-- name: demo_foreign_steps
-- `evq demo` runs a worker whose adapters point at loopback sinks: on a database
-- that holds anyone else's steps it would claim their sends and "deliver" them
-- to the sink, and that database's own workers would send the demo's. So the
-- demo runs only where every step is a demo's (run ids `demo-...`).
SELECT count(*)::bigint AS n, min(run_id) AS example
FROM email_steps
WHERE run_id NOT LIKE 'demo-%';


-- name: schema_migrator
-- Whether the role running `evq db upgrade` may migrate: it must own evq's tables (or
-- be a member of their owner), or, on a database without them, may create in the
-- current schema. A runtime role may do neither (migrations/baseline/roles.sql).
WITH t AS (
    SELECT (SELECT c.relowner FROM pg_class c WHERE c.oid = to_regclass('email_steps')) AS owner
)
SELECT current_user AS role,
       pg_get_userbyid(t.owner) AS owner,
       current_schema() AS schema,
       CASE WHEN t.owner IS NULL THEN coalesce(has_schema_privilege(current_schema(), 'CREATE'), false)
            ELSE pg_has_role(current_user, t.owner, 'USAGE') END AS may_migrate,
       to_regprocedure('evq_grant_runtime(name)') IS NOT NULL AS can_grant
FROM t;


-- name: runtime_roles
-- The roles evq_grant_runtime granted before (the only way a role gets EXECUTE on
-- evq_prune_batch, which PUBLIC lacks), so every upgrade grants them again and a
-- table a later revision adds reaches them too.
SELECT r.rolname AS role
FROM pg_roles r
WHERE r.rolname !~ '^pg_'
  AND NOT r.rolsuper
  AND has_function_privilege(r.oid, 'evq_prune_batch(timestamptz, integer, text, uuid, integer)', 'EXECUTE')
  AND NOT pg_has_role(r.oid, (SELECT c.relowner FROM pg_class c WHERE c.oid = 'email_steps'::regclass), 'MEMBER')
ORDER BY r.rolname;


-- name: runtime_grant
-- The runtime role's privileges, exactly (evq_grant_runtime, migrations/baseline/roles.sql).
SELECT evq_grant_runtime(%(role)s) AS granted;


-- name: callback_claim
-- The deliveries due now, each held for hold_seconds (next_attempt_at moves forward,
-- attempts counts this try) so no other worker takes it meanwhile; a worker that dies
-- mid-POST leaves it due again once the hold passes (at-least-once). SKIP LOCKED keeps
-- concurrent claims apart. With each: its event, the key's URL and what signs it.
WITH t AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), picked AS (
    SELECT c.id
    FROM callback_deliveries c
    WHERE c.status = 'pending' AND c.next_attempt_at <= (SELECT now FROM t)
    ORDER BY c.next_attempt_at, c.id
    LIMIT %(limit)s
    FOR UPDATE OF c SKIP LOCKED
), held AS (
    UPDATE callback_deliveries c
    SET next_attempt_at = t.now + make_interval(secs => %(hold_seconds)s),
        attempts = c.attempts + 1,
        updated_at = t.now
    FROM picked, t
    WHERE c.id = picked.id
    RETURNING c.id, c.event_id, c.key_id, c.attempts
)
SELECT h.id, h.attempts, k.notify_url AS url, k.name AS key_name, k.callback_generation, p.pepper,
       e.id AS event_id, e.kind, e.step, e.run_id, e.step_id, e.status, e.reason, e.detail, e.actor,
       e.evidence_id, e.key_id, e.created_at
FROM held h
JOIN key_events e ON e.id = h.event_id
JOIN api_keys k ON k.key_id = h.key_id
CROSS JOIN api_key_pepper p
ORDER BY h.id;


-- name: callback_delivered
UPDATE callback_deliveries
SET status = 'delivered', delivered_at = coalesce(%(now)s::timestamptz, now()), last_status = %(status_code)s,
    last_error = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = 'pending';


-- name: callback_failed
-- A try that did not get a 2xx: due again after the backoff, or given up (the event
-- stays in the key's feed either way). The error names what failed, never the URL.
UPDATE callback_deliveries
SET status = CASE WHEN %(give_up)s THEN 'failed' ELSE 'pending' END,
    next_attempt_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s),
    last_status = %(status_code)s,
    last_error = left(%(error)s, 500),
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = 'pending';


-- name: api_key_set_url
-- A key's callback URL (NULL: none); rotate: a new signing secret (the generation it derives from).
UPDATE api_keys k
SET notify_url = %(notify_url)s,
    callback_generation = k.callback_generation + CASE WHEN %(rotate)s THEN 1 ELSE 0 END
FROM api_key_pepper p
WHERE k.name = %(name)s AND p.id = 1
RETURNING k.name, k.role, k.key_id, k.created_at, k.created_by, k.revoked_at, k.revoked_by, k.notify_email,
          k.notify_url, k.approval, k.callback_generation, p.pepper;


-- name: heartbeat_beat
-- A running worker says so (table worker_heartbeats); rows of workers gone
-- for a day without a goodbye (killed) go in the same statement, so the table stays
-- the size of the fleet.
WITH gone AS (
    DELETE FROM worker_heartbeats WHERE seen_at < now() - interval '1 day' AND owner <> %(owner)s
)
INSERT INTO worker_heartbeats (owner, providers) VALUES (%(owner)s, %(providers)s)
ON CONFLICT (owner) DO UPDATE SET seen_at = now(), providers = EXCLUDED.providers;


-- name: heartbeat_end
-- A worker that stops says goodbye: health must not count it as running.
DELETE FROM worker_heartbeats WHERE owner = %(owner)s;


-- name: providers_waiting
-- The providers that steps wait for now (pending, or retryable and due): `evq admin health`
-- checks that a worker seen recently sends through each. From the queue.
SELECT DISTINCT q.provider
FROM step_queue q
WHERE q.lease_token IS NULL AND q.next_attempt_at <= now()
ORDER BY q.provider;


-- name: heartbeats_seen
-- The workers that beat within the last %(within)s seconds, on the database's clock.
SELECT owner, providers, started_at, seen_at, extract(epoch FROM now() - seen_at)::float8 AS age_seconds
FROM worker_heartbeats
WHERE seen_at >= now() - make_interval(secs => %(within)s)
ORDER BY seen_at DESC;


-- name: queue_sample
-- The queue sampler (worker/sampler.py), once a minute from every worker and `evq serve`:
-- this minute's figures, computed here from the live table by the collector's own query
-- (queue_stats, included whole so the two never disagree on what "lag" or "unknown" mean),
-- written only if no process wrote this minute yet (the first writer wins, so many
-- processes make one row a minute), and the samples older than the kept window deleted
-- in the same statement, so the table holds 7 days of minutes at most.
WITH stats AS (
-- include: queue_stats
), doomed AS (
    DELETE FROM queue_samples q
    WHERE q.at < date_trunc('minute', coalesce(%(now)s::timestamptz, now())) - make_interval(secs => %(keep_seconds)s)
    RETURNING q.at
), written AS (
    INSERT INTO queue_samples (at, pending, claimable, lag_seconds, in_flight, retryable, unknown,
                               unknown_oldest_seconds, held, sampled_by)
    SELECT date_trunc('minute', coalesce(%(now)s::timestamptz, now())), s.pending, s.pending_due,
           s.pending_oldest_age, s.in_flight, s.retryable, s.unknown,
           -- NULL, not 0, when nothing is unknown: "no oldest" is not "an unknown row of age 0".
           CASE WHEN s.unknown > 0 THEN s.unknown_oldest_age END, s.held, %(sampled_by)s
    FROM stats s
    -- Another process sampled this minute already: an uncorrelated test, so the planner checks
    -- it once before the stats, and the later samplers of the minute never compute them.
    WHERE NOT EXISTS (SELECT 1 FROM queue_samples q
                      WHERE q.at = date_trunc('minute', coalesce(%(now)s::timestamptz, now())))
    ON CONFLICT (at) DO NOTHING
    RETURNING at
)
SELECT (SELECT count(*) FROM written)::int AS written, (SELECT count(*) FROM doomed)::int AS deleted;


-- name: rollup_cut
-- A fragment, only included (chart_sends, chart_providers): the window [since, until) cut
-- in three, c.lo and c.hi: [since, lo) and [hi, until) are read live from evidence, [lo, hi)
-- is the whole minutes the sampler rolled up (send_rollup). Without a watermark lo = hi =
-- until and everything is live.
cut AS (
    SELECT least(greatest(w.since, date_trunc('minute', %(since)s::timestamptz + interval '1 minute' - interval '1 microsecond')),
                 %(until)s::timestamptz) AS lo,
           w.upto
    FROM send_rollup_watermark w
), c AS (
    SELECT coalesce((SELECT lo FROM cut), %(until)s::timestamptz) AS lo,
           coalesce((SELECT greatest(least(upto, date_trunc('minute', %(until)s::timestamptz)), lo) FROM cut),
                    %(until)s::timestamptz) AS hi
)


-- name: chart_sends
-- The overview's sends per bucket by outcome (ops/web/charts.py): each provider_response
-- row by its outcome, and each step the rescuer made unknown with no answer at all
-- (lease_expired to unknown) as 'no_answer'. The window is cut in three: [since, lo) and
-- [hi, until) are counted from evidence (read through ix_evidence_created_at_brin, so only
-- those few minutes' blocks), [lo, hi) from send_rollups, the minutes the sampler rolled up
-- (send_rollup). Without a watermark lo = hi = until and everything is live. Buckets are
-- whole minutes wide, so a rollup minute falls in exactly one bucket.
WITH
-- include: rollup_cut
, live AS (
    SELECT e.created_at, e.kind, e.outcome
    FROM evidence e
    WHERE e.created_at >= %(since)s AND e.created_at < (SELECT lo FROM c)
      AND (e.kind = 'provider_response' OR (e.kind = 'lease_expired' AND e.to_status = 'unknown'))
    UNION ALL
    SELECT e.created_at, e.kind, e.outcome
    FROM evidence e
    WHERE e.created_at >= (SELECT hi FROM c) AND e.created_at < %(until)s
      AND (e.kind = 'provider_response' OR (e.kind = 'lease_expired' AND e.to_status = 'unknown'))
), counted AS (
    SELECT l.created_at AS at, CASE WHEN l.kind = 'provider_response' THEN l.outcome ELSE 'no_answer' END AS outcome,
           1::bigint AS n
    FROM live l
    UNION ALL
    SELECT r.minute, r.outcome, r.n
    FROM send_rollups r
    WHERE r.minute >= (SELECT lo FROM c) AND r.minute < (SELECT hi FROM c) AND r.outcome <> 'attempt'
)
SELECT to_timestamp(floor(extract(epoch FROM x.at)::float8 / %(bucket)s) * %(bucket)s) AS at,
       x.outcome, sum(x.n)::bigint AS n
FROM counted x
GROUP BY 1, 2
ORDER BY 1, 2;


-- name: send_rollup_lock
-- One rollup writer at a time (every worker and `evq serve` run a sampler): the others skip
-- this minute instead of waiting; the lock ends with the transaction.
SELECT pg_try_advisory_xact_lock(hashtext('evq.send_rollups')) AS got;


-- name: send_rollup
-- Roll up every complete minute not rolled up yet: from the watermark (or 24 h back on the
-- first run) to the minute that ended at least 2 minutes ago (why 2 is enough:
-- docs/design.md, "The operators' page"), per minute x provider x outcome ('attempt' for attempt_started). The
-- watermark moves over empty minutes too, so they are never re-read; rollups older than
-- %(keep_seconds)s are deleted and the watermark's since moves with them.
WITH b AS (
    SELECT coalesce((SELECT w.upto FROM send_rollup_watermark w),
                    date_trunc('minute', coalesce(%(now)s::timestamptz, now())) - interval '24 hours') AS lo,
           date_trunc('minute', coalesce(%(now)s::timestamptz, now()) - interval '2 minutes') AS hi,
           date_trunc('minute', coalesce(%(now)s::timestamptz, now())) - make_interval(secs => %(keep_seconds)s) AS keep_from
), rolled AS (
    INSERT INTO send_rollups (minute, provider, outcome, n)
    SELECT date_trunc('minute', e.created_at),
           (SELECT s.provider FROM email_steps s WHERE s.id = e.step_id),
           CASE e.kind WHEN 'attempt_started' THEN 'attempt' WHEN 'provider_response' THEN e.outcome ELSE 'no_answer' END,
           count(*)
    FROM evidence e, b
    WHERE e.created_at >= b.lo AND e.created_at < b.hi
      AND (e.kind IN ('attempt_started', 'provider_response') OR (e.kind = 'lease_expired' AND e.to_status = 'unknown'))
    GROUP BY 1, 2, 3
    ON CONFLICT DO NOTHING
    RETURNING 1
), doomed AS (
    DELETE FROM send_rollups r USING b WHERE r.minute < b.keep_from RETURNING 1
), moved AS (
    INSERT INTO send_rollup_watermark AS w (id, since, upto)
    SELECT true, greatest(b.lo, b.keep_from), b.hi FROM b WHERE b.hi > b.lo
    ON CONFLICT (id) DO UPDATE SET upto = excluded.upto, since = greatest(w.since, (SELECT keep_from FROM b))
    RETURNING 1
)
SELECT (SELECT greatest(extract(epoch FROM b.hi - b.lo) / 60, 0) FROM b)::int AS minutes,
       (SELECT count(*) FROM rolled)::int AS rows, (SELECT count(*) FROM doomed)::int AS deleted,
       (SELECT count(*) FROM moved)::int AS moved;


-- name: chart_unknown_ages
-- Unknown rows now by how long each has been unknown, in the buckets whose lower bounds
-- are %(bounds)s (width_bucket: 0 below the first bound); ix_email_steps_unknown_since.
SELECT width_bucket(extract(epoch FROM %(now)s::timestamptz - s.unknown_since)::float8, %(bounds)s::float8[]) AS bucket,
       count(*)::bigint AS n
FROM email_steps s
WHERE s.status = 'unknown'
GROUP BY 1
ORDER BY 1;


-- name: chart_queue_samples
-- The sampler's minutes in the window (the primary key is the minute); a minute nobody
-- sampled has no row, and the chart draws it as a gap.
SELECT q.at, q.pending, q.claimable, q.lag_seconds, q.in_flight, q.retryable, q.unknown,
       q.unknown_oldest_seconds, q.held
FROM queue_samples q
WHERE q.at >= %(since)s AND q.at < %(until)s
ORDER BY q.at;


-- name: chart_providers
-- Per provider in the window: attempts started, answers by outcome, steps lost without an
-- answer (the rolled-up minutes from send_rollups, the rest live, as chart_sends cuts it),
-- and the median and p95 of the answers' latency over the window's last hour only, read
-- live (send_rollups keeps counts, not latencies; a day of answers is too many rows to read
-- for a page). Live evidence is read through the BRIN index; each row's provider is one
-- lookup by email_steps' primary key (a scalar subquery, so the planner cannot turn it into
-- a hash join over the whole table).
WITH
-- include: rollup_cut
, live AS (
    SELECT e.step_id, e.kind, e.outcome FROM evidence e
    WHERE e.created_at >= %(since)s AND e.created_at < (SELECT lo FROM c)
      AND (e.kind IN ('attempt_started', 'provider_response') OR (e.kind = 'lease_expired' AND e.to_status = 'unknown'))
    UNION ALL
    SELECT e.step_id, e.kind, e.outcome FROM evidence e
    WHERE e.created_at >= (SELECT hi FROM c) AND e.created_at < %(until)s
      AND (e.kind IN ('attempt_started', 'provider_response') OR (e.kind = 'lease_expired' AND e.to_status = 'unknown'))
), per_row AS (
    SELECT (SELECT s.provider FROM email_steps s WHERE s.id = l.step_id) AS provider,
           CASE l.kind WHEN 'attempt_started' THEN 'attempt' WHEN 'provider_response' THEN l.outcome ELSE 'no_answer' END AS outcome,
           1::bigint AS n
    FROM live l
    UNION ALL
    SELECT r.provider, r.outcome, r.n
    FROM send_rollups r
    WHERE r.minute >= (SELECT lo FROM c) AND r.minute < (SELECT hi FROM c)
), counts AS (
    SELECT p.provider,
           coalesce(sum(p.n) FILTER (WHERE p.outcome = 'attempt'), 0)::bigint AS attempts,
           coalesce(sum(p.n) FILTER (WHERE p.outcome = 'accepted'), 0)::bigint AS accepted,
           coalesce(sum(p.n) FILTER (WHERE p.outcome = 'rejected'), 0)::bigint AS rejected,
           coalesce(sum(p.n) FILTER (WHERE p.outcome = 'retryable'), 0)::bigint AS retryable,
           coalesce(sum(p.n) FILTER (WHERE p.outcome = 'unknown'), 0)::bigint AS unknown,
           coalesce(sum(p.n) FILTER (WHERE p.outcome = 'no_answer'), 0)::bigint AS no_answer
    FROM per_row p
    GROUP BY p.provider
), latency AS (
    SELECT x.provider,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY x.ms) AS p50_ms,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY x.ms) AS p95_ms
    FROM (SELECT (SELECT s.provider FROM email_steps s WHERE s.id = e.step_id) AS provider, e.latency_ms AS ms
          FROM evidence e
          WHERE e.created_at >= greatest(%(since)s::timestamptz, %(until)s::timestamptz - interval '1 hour')
            AND e.created_at < %(until)s AND e.kind = 'provider_response' AND e.latency_ms IS NOT NULL) x
    GROUP BY x.provider
)
SELECT c.*, l.p50_ms, l.p95_ms
FROM counts c
LEFT JOIN latency l ON l.provider = c.provider
ORDER BY c.provider;


-- name: list_settings
-- A list's and its counts' own settings for their transaction only (SET LOCAL, so it works
-- behind PgBouncer too): no parallel workers, since step_list's switched-off state branches
-- are constant-false plans that PostgreSQL still starts workers for (100-300 ms each on a
-- busy machine, for nothing), and no JIT, which costs more to compile than a page read takes.
SELECT set_config('max_parallel_workers_per_gather', '0', true), set_config('jit', 'off', true);


-- name: chart_settings
-- The chart reads' own limits for their transaction only (SET LOCAL, so it works behind
-- PgBouncer too): a window's aggregate sorts in memory instead of spilling to disk, JIT
-- (which costs more to compile than these reads take) stays off, and a read that would
-- hold the page longer than the timeout fails instead (the page says so).
SELECT set_config('work_mem', '32MB', true), set_config('jit', 'off', true),
       set_config('statement_timeout', %(timeout_ms)s::text, true);
