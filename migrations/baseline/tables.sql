-- Generated from adapters/postgres/schema.py by `python -m evq.migrations.render`: do not edit
-- (docs/design.md, "Data model", says what each table holds; the model says why each index is
-- there). Every table, column, constraint and index of evq's schema, in dependency order; each
-- table's indexes follow it, by name. The search index needs search.sql's function first.

CREATE TABLE api_key_pepper (
    id SMALLINT DEFAULT 1 NOT NULL,
    pepper BYTEA NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    wire_keys_from BIGINT NOT NULL,
    CONSTRAINT pk_api_key_pepper PRIMARY KEY (id),
    CONSTRAINT ck_api_key_pepper_one_row CHECK (id = 1),
    CONSTRAINT ck_api_key_pepper_long_enough CHECK (octet_length(pepper) >= 32),
    CONSTRAINT ck_api_key_pepper_wire_keys_from_positive CHECK (wire_keys_from >= 1)
);

CREATE TABLE api_keys (
    id BIGSERIAL NOT NULL,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    key_id TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    created_by TEXT,
    revoked_at TIMESTAMP WITH TIME ZONE,
    revoked_by TEXT,
    session_generation INTEGER DEFAULT 0 NOT NULL,
    notify_email TEXT,
    notify_url TEXT,
    callback_generation INTEGER DEFAULT 0 NOT NULL,
    approval TEXT NOT NULL,
    CONSTRAINT pk_api_keys PRIMARY KEY (id),
    CONSTRAINT uq_api_keys_name UNIQUE (name),
    CONSTRAINT uq_api_keys_key_id UNIQUE (key_id),
    CONSTRAINT ck_api_keys_role CHECK (role IN ('agent', 'operator', 'admin')),
    CONSTRAINT ck_api_keys_key_id_format CHECK (key_id ~ '^[0-9a-f]{12}$'),
    CONSTRAINT ck_api_keys_secret_hash_scheme CHECK (secret_hash LIKE 'scrypt$%' OR secret_hash LIKE 'hmac-sha256$%'),
    CONSTRAINT ck_api_keys_revoked_by_when_revoked CHECK (revoked_by IS NULL OR revoked_at IS NOT NULL),
    CONSTRAINT ck_api_keys_approval CHECK (approval IN ('always', 'policy', 'never'))
);

CREATE TABLE decisions (
    id BIGSERIAL NOT NULL,
    run_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    intent TEXT,
    instruction_version TEXT,
    prompt_version TEXT,
    model TEXT,
    tool TEXT,
    rationale JSONB,
    decided_at TIMESTAMP WITH TIME ZONE,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    actor TEXT,
    actor_key_id TEXT,
    interface TEXT,
    CONSTRAINT pk_decisions PRIMARY KEY (id)
);
CREATE INDEX ix_decisions_actor ON decisions (actor, id) WHERE actor IS NOT NULL;
CREATE INDEX ix_decisions_run_id_created_at ON decisions (run_id, created_at);

CREATE TABLE delivery_events (
    id BIGSERIAL NOT NULL,
    provider TEXT NOT NULL,
    event_id TEXT NOT NULL,
    type TEXT NOT NULL,
    occurred_at TIMESTAMP WITH TIME ZONE,
    received_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    step_id BIGINT,
    key_digest TEXT,
    message_id TEXT,
    provider_message_id TEXT,
    recipient TEXT,
    detail JSONB DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT pk_delivery_events PRIMARY KEY (id),
    CONSTRAINT uq_delivery_events_provider_event_id UNIQUE (provider, event_id),
    CONSTRAINT ck_delivery_events_type CHECK (type IN ('delivered', 'deferred', 'bounced_hard', 'bounced_soft', 'complained', 'opened', 'clicked'))
);
CREATE INDEX ix_delivery_events_step_id_id ON delivery_events (step_id, id);
CREATE INDEX ix_delivery_events_unmatched ON delivery_events (id) WHERE step_id IS NULL;

CREATE TABLE enqueue_refusal_counts (
    interface TEXT NOT NULL,
    field TEXT NOT NULL,
    total BIGINT NOT NULL,
    CONSTRAINT pk_enqueue_refusal_counts PRIMARY KEY (interface, field),
    CONSTRAINT ck_enqueue_refusal_counts_total_nonnegative CHECK (total >= 0)
);

CREATE TABLE enqueue_refusals (
    id BIGSERIAL NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    interface TEXT NOT NULL,
    key_name TEXT,
    dry_run BOOLEAN DEFAULT false NOT NULL,
    requests INTEGER NOT NULL,
    request_bytes BIGINT NOT NULL,
    request_sha256 TEXT NOT NULL,
    errors JSONB NOT NULL,
    error_count INTEGER NOT NULL,
    reasons TEXT[] NOT NULL,
    asked JSONB NOT NULL,
    CONSTRAINT pk_enqueue_refusals PRIMARY KEY (id),
    CONSTRAINT ck_enqueue_refusals_interface CHECK (interface IN ('cli', 'http', 'mcp', 'python')),
    CONSTRAINT ck_enqueue_refusals_counts_nonnegative CHECK (requests >= 0 AND request_bytes >= 0 AND error_count >= 0),
    CONSTRAINT ck_enqueue_refusals_sha256_length CHECK (length(request_sha256) = 64),
    CONSTRAINT ck_enqueue_refusals_bounded CHECK (pg_column_size(errors) + pg_column_size(asked) <= 65536)
);
CREATE INDEX ix_enqueue_refusals_created_at ON enqueue_refusals (created_at);

CREATE TABLE key_events (
    id BIGSERIAL NOT NULL,
    key_id TEXT,
    kind TEXT NOT NULL,
    step BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    status TEXT,
    reason TEXT,
    detail TEXT,
    actor TEXT NOT NULL,
    evidence_id BIGINT NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_key_events PRIMARY KEY (id),
    CONSTRAINT ck_key_events_kind CHECK (kind IN ('rejected', 'unknown', 'verdict'))
);
CREATE INDEX ix_key_events_key_id_id ON key_events (key_id, id);

CREATE TABLE known_recipients (
    sender TEXT NOT NULL,
    recipient TEXT NOT NULL,
    first_step_id BIGINT,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_known_recipients PRIMARY KEY (sender, recipient)
);

CREATE TABLE provider_circuit_events (
    id BIGSERIAL NOT NULL,
    provider TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT,
    detail TEXT,
    actor TEXT NOT NULL,
    probe_in FLOAT,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_provider_circuit_events PRIMARY KEY (id),
    CONSTRAINT ck_provider_circuit_events_from_state CHECK (from_state IN ('closed', 'half_open', 'open')),
    CONSTRAINT ck_provider_circuit_events_to_state CHECK (to_state IN ('closed', 'half_open', 'open'))
);
CREATE INDEX ix_provider_circuit_events_provider_id ON provider_circuit_events (provider, id);

CREATE TABLE provider_circuits (
    provider TEXT NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    detail TEXT,
    opened_at TIMESTAMP WITH TIME ZONE,
    probe_at TIMESTAMP WITH TIME ZONE,
    probes INTEGER DEFAULT '0' NOT NULL,
    probe_owner TEXT,
    probe_expires_at TIMESTAMP WITH TIME ZONE,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_provider_circuits PRIMARY KEY (provider),
    CONSTRAINT ck_provider_circuits_state CHECK (state IN ('closed', 'half_open', 'open')),
    CONSTRAINT ck_provider_circuits_opened_iff_not_closed CHECK ((state = 'closed') = (opened_at IS NULL)),
    CONSTRAINT ck_provider_circuits_probe_at_iff_open CHECK ((state = 'open') = (probe_at IS NOT NULL)),
    CONSTRAINT ck_provider_circuits_probe_held_iff_half_open CHECK ((state = 'half_open') = (probe_owner IS NOT NULL AND probe_expires_at IS NOT NULL)),
    CONSTRAINT ck_provider_circuits_probes_nonnegative CHECK (probes >= 0)
);

CREATE TABLE provider_rate_limits (
    provider TEXT NOT NULL,
    tokens FLOAT NOT NULL,
    refilled_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    paused_until TIMESTAMP WITH TIME ZONE,
    CONSTRAINT pk_provider_rate_limits PRIMARY KEY (provider),
    CONSTRAINT ck_provider_rate_limits_tokens_not_negative CHECK (tokens >= 0)
);

CREATE TABLE prune_log (
    id BIGSERIAL NOT NULL,
    run UUID NOT NULL,
    batch INTEGER NOT NULL,
    actor TEXT NOT NULL,
    cutoff TIMESTAMP WITH TIME ZONE NOT NULL,
    steps INTEGER NOT NULL,
    evidence BIGINT NOT NULL,
    decisions INTEGER NOT NULL,
    first_step_id BIGINT,
    last_step_id BIGINT,
    evidence_partition TEXT,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_prune_log PRIMARY KEY (id),
    CONSTRAINT uq_prune_log_run_batch UNIQUE (run, batch),
    CONSTRAINT ck_prune_log_counts_nonnegative CHECK (steps >= 0 AND evidence >= 0 AND decisions >= 0)
);
CREATE INDEX ix_prune_log_dropped_ranges ON prune_log (first_step_id, last_step_id) WHERE evidence_partition IS NOT NULL;

CREATE TABLE queue_samples (
    at TIMESTAMP WITH TIME ZONE NOT NULL,
    pending INTEGER NOT NULL,
    claimable INTEGER NOT NULL,
    lag_seconds FLOAT NOT NULL,
    in_flight INTEGER NOT NULL,
    retryable INTEGER NOT NULL,
    unknown INTEGER NOT NULL,
    unknown_oldest_seconds FLOAT,
    held INTEGER NOT NULL,
    sampled_by TEXT NOT NULL,
    CONSTRAINT pk_queue_samples PRIMARY KEY (at),
    CONSTRAINT ck_queue_samples_at_minute CHECK (at = date_trunc('minute', at))
);

CREATE TABLE send_budgets (
    budget TEXT NOT NULL,
    scope TEXT NOT NULL,
    window_start TIMESTAMP WITH TIME ZONE NOT NULL,
    used INTEGER DEFAULT '0' NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_send_budgets PRIMARY KEY (budget, scope, window_start),
    CONSTRAINT ck_send_budgets_used_nonnegative CHECK (used >= 0)
);

CREATE TABLE send_rollup_watermark (
    id BOOLEAN DEFAULT true NOT NULL,
    since TIMESTAMP WITH TIME ZONE NOT NULL,
    upto TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT pk_send_rollup_watermark PRIMARY KEY (id),
    CONSTRAINT ck_send_rollup_watermark_one_row CHECK (id)
);

CREATE TABLE send_rollups (
    minute TIMESTAMP WITH TIME ZONE NOT NULL,
    provider TEXT NOT NULL,
    outcome TEXT NOT NULL,
    n BIGINT NOT NULL,
    CONSTRAINT pk_send_rollups PRIMARY KEY (minute, provider, outcome),
    CONSTRAINT ck_send_rollups_minute CHECK (minute = date_trunc('minute', minute))
);

CREATE TABLE step_keys (
    idempotency_key TEXT NOT NULL,
    id BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    payload_sha256 BYTEA NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL,
    status TEXT,
    reason TEXT,
    maybe_delivered BOOLEAN,
    corrected_sha256 BYTEA,
    closed_at TIMESTAMP WITH TIME ZONE,
    pruned_at TIMESTAMP WITH TIME ZONE,
    CONSTRAINT pk_step_keys PRIMARY KEY (idempotency_key),
    CONSTRAINT ck_step_keys_payload_sha256_bytes CHECK (length(payload_sha256) = 32),
    CONSTRAINT ck_step_keys_corrected_sha256_bytes CHECK (corrected_sha256 IS NULL OR length(corrected_sha256) = 32),
    CONSTRAINT ck_step_keys_status CHECK (status IS NULL OR status IN ('accepted', 'rejected')),
    CONSTRAINT ck_step_keys_pruned_with_its_end CHECK ((pruned_at IS NULL) = (status IS NULL) AND (pruned_at IS NULL) = (closed_at IS NULL))
);
CREATE INDEX ix_step_keys_id ON step_keys (id);
CREATE INDEX ix_step_keys_key_sha256 ON step_keys USING hash (sha256(decode(replace(idempotency_key, '\', '\\'), 'escape'))) WHERE pruned_at IS NULL;
CREATE UNIQUE INDEX uq_step_keys_message_id ON step_keys (message_id) WHERE pruned_at IS NULL;

CREATE TABLE step_queue (
    id BIGINT NOT NULL,
    provider TEXT NOT NULL,
    priority SMALLINT DEFAULT '0' NOT NULL,
    next_attempt_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    attempts INTEGER DEFAULT '0' NOT NULL,
    first_attempt_at TIMESTAMP WITH TIME ZONE,
    dedupe_until TIMESTAMP WITH TIME ZONE,
    maybe_delivered BOOLEAN DEFAULT false NOT NULL,
    lease_owner TEXT,
    lease_token UUID,
    lease_expires_at TIMESTAMP WITH TIME ZONE,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_step_queue PRIMARY KEY (id),
    CONSTRAINT ck_step_queue_lease_whole CHECK ((lease_token IS NULL) = (lease_owner IS NULL) AND (lease_token IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT ck_step_queue_lease_counts_attempt CHECK (lease_token IS NULL OR attempts >= 1),
    CONSTRAINT ck_step_queue_attempts_nonnegative CHECK (attempts >= 0),
    CONSTRAINT ck_step_queue_first_attempt_iff_attempted CHECK ((attempts = 0) = (first_attempt_at IS NULL)),
    CONSTRAINT ck_step_queue_maybe_delivered_after_attempt CHECK (NOT maybe_delivered OR attempts >= 1),
    CONSTRAINT ck_step_queue_priority_range CHECK (priority BETWEEN -1 AND 1)
);
CREATE INDEX ix_step_queue_claimable ON step_queue (priority DESC, next_attempt_at, id) WHERE lease_token IS NULL;
CREATE INDEX ix_step_queue_lease_expiry ON step_queue (lease_expires_at) WHERE lease_token IS NOT NULL;
CREATE INDEX ix_step_queue_maybe_delivered ON step_queue (dedupe_until) WHERE maybe_delivered AND lease_token IS NULL;

CREATE TABLE worker_heartbeats (
    owner TEXT NOT NULL,
    providers TEXT[] DEFAULT '{}' NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    seen_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_worker_heartbeats PRIMARY KEY (owner)
);

CREATE TABLE callback_deliveries (
    id BIGSERIAL NOT NULL,
    event_id BIGINT NOT NULL,
    key_id TEXT NOT NULL,
    status TEXT DEFAULT 'pending' NOT NULL,
    attempts INTEGER DEFAULT '0' NOT NULL,
    next_attempt_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    last_status INTEGER,
    last_error TEXT,
    delivered_at TIMESTAMP WITH TIME ZONE,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_callback_deliveries PRIMARY KEY (id),
    CONSTRAINT uq_callback_deliveries_event_id UNIQUE (event_id),
    CONSTRAINT ck_callback_deliveries_status CHECK (status IN ('pending', 'delivered', 'failed')),
    CONSTRAINT ck_callback_deliveries_delivered_iff_delivered_at CHECK ((status = 'delivered') = (delivered_at IS NOT NULL)),
    CONSTRAINT ck_callback_deliveries_attempts_nonnegative CHECK (attempts >= 0),
    CONSTRAINT fk_callback_deliveries_event_id_key_events FOREIGN KEY(event_id) REFERENCES key_events (id)
);
CREATE INDEX ix_callback_deliveries_due ON callback_deliveries (next_attempt_at, id) WHERE status = 'pending';

CREATE TABLE email_steps (
    id BIGSERIAL NOT NULL,
    run_id TEXT NOT NULL,
    step_id TEXT NOT NULL,
    decision_id BIGINT NOT NULL,
    idempotency_key TEXT NOT NULL,
    message_id TEXT NOT NULL,
    provider TEXT NOT NULL,
    payload JSONB NOT NULL,
    payload_sha256 TEXT NOT NULL,
    status TEXT DEFAULT 'pending' NOT NULL,
    reason TEXT,
    detail TEXT,
    attempts INTEGER DEFAULT '0' NOT NULL,
    max_attempts INTEGER,
    next_attempt_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    dedupe_until TIMESTAMP WITH TIME ZONE,
    maybe_delivered BOOLEAN DEFAULT false NOT NULL,
    provider_message_id TEXT,
    notify TEXT,
    notice_of BIGINT,
    reconcile_after TIMESTAMP WITH TIME ZONE,
    reconcile_checks INTEGER DEFAULT '0' NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    first_attempt_at TIMESTAMP WITH TIME ZONE,
    unknown_since TIMESTAMP WITH TIME ZONE,
    closed_at TIMESTAMP WITH TIME ZONE,
    uncharged_attempts INTEGER DEFAULT '0' NOT NULL,
    retry_from TIMESTAMP WITH TIME ZONE,
    content_redacted_at TIMESTAMP WITH TIME ZONE,
    priority SMALLINT DEFAULT '0' NOT NULL,
    send_at TIMESTAMP WITH TIME ZONE,
    held_since TIMESTAMP WITH TIME ZONE,
    hold_expires_at TIMESTAMP WITH TIME ZONE,
    hold JSONB,
    requested_sha256 TEXT,
    CONSTRAINT pk_email_steps PRIMARY KEY (id),
    CONSTRAINT uq_email_steps_idempotency_key UNIQUE (idempotency_key),
    CONSTRAINT uq_email_steps_run_id_step_id UNIQUE (run_id, step_id),
    CONSTRAINT ck_email_steps_status CHECK (status IN ('held', 'pending', 'retryable', 'unknown', 'accepted', 'rejected')),
    CONSTRAINT ck_email_steps_closed_iff_terminal CHECK ((status IN ('accepted', 'rejected')) = (closed_at IS NOT NULL)),
    CONSTRAINT ck_email_steps_unknown_since_iff_unknown CHECK ((status = 'unknown') = (unknown_since IS NOT NULL)),
    CONSTRAINT ck_email_steps_attempts_nonnegative CHECK (attempts >= 0),
    CONSTRAINT ck_email_steps_max_attempts_positive CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT ck_email_steps_first_attempt_iff_attempted CHECK ((attempts = 0) = (first_attempt_at IS NULL)),
    CONSTRAINT ck_email_steps_payload_sha256_hex CHECK (payload_sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT ck_email_steps_payload_object CHECK (jsonb_typeof(payload) = 'object'),
    CONSTRAINT ck_email_steps_idempotency_key_length CHECK (length(idempotency_key) BETWEEN 1 AND 512),
    CONSTRAINT ck_email_steps_message_id_format CHECK (message_id ~ '^<[^<>@[:space:]]+@[^<>@[:space:]]+>$'),
    CONSTRAINT ck_email_steps_maybe_delivered_after_attempt CHECK (NOT maybe_delivered OR attempts >= 1),
    CONSTRAINT ck_email_steps_notice_never_notifies CHECK (notice_of IS NULL OR notify IS NULL),
    CONSTRAINT ck_email_steps_reconcile_checks_nonnegative CHECK (reconcile_checks >= 0),
    CONSTRAINT ck_email_steps_uncharged_within_attempts CHECK (uncharged_attempts >= 0 AND uncharged_attempts <= attempts),
    CONSTRAINT ck_email_steps_redacted_only_when_closed CHECK (content_redacted_at IS NULL OR status IN ('accepted', 'rejected')),
    CONSTRAINT ck_email_steps_held_since_iff_held CHECK ((status = 'held') = (held_since IS NOT NULL)),
    CONSTRAINT ck_email_steps_hold_expiry_only_when_held CHECK (hold_expires_at IS NULL OR status = 'held'),
    CONSTRAINT ck_email_steps_priority_range CHECK (priority BETWEEN -1 AND 1),
    CONSTRAINT ck_email_steps_requested_sha256_hex CHECK (requested_sha256 IS NULL OR requested_sha256 ~ '^[0-9a-f]{64}$'),
    CONSTRAINT fk_email_steps_decision_id_decisions FOREIGN KEY(decision_id) REFERENCES decisions (id),
    CONSTRAINT fk_email_steps_notice_of_email_steps FOREIGN KEY(notice_of) REFERENCES email_steps (id)
);
CREATE INDEX ix_email_steps_content_due ON email_steps (closed_at, id) WHERE status IN ('accepted', 'rejected') AND content_redacted_at IS NULL;
CREATE INDEX ix_email_steps_decision_id ON email_steps (decision_id) INCLUDE (status, created_at, unknown_since, held_since, id);
CREATE INDEX ix_email_steps_held ON email_steps (held_since, id) WHERE status = 'held';
CREATE INDEX ix_email_steps_notice_of ON email_steps (notice_of) WHERE notice_of IS NOT NULL;
CREATE INDEX ix_email_steps_provider_message_id ON email_steps (provider_message_id) WHERE provider_message_id IS NOT NULL;
CREATE INDEX ix_email_steps_recipient_keys ON email_steps USING gin (evq_recipient_keys(payload));
CREATE INDEX ix_email_steps_status_created_at ON email_steps (status, created_at);
CREATE INDEX ix_email_steps_unknown_since ON email_steps (unknown_since, id) WHERE status = 'unknown';

CREATE TABLE evidence (
    id BIGSERIAL NOT NULL,
    step_id BIGINT NOT NULL,
    run_id TEXT NOT NULL,
    attempt INTEGER,
    kind TEXT NOT NULL,
    actor TEXT NOT NULL,
    from_status TEXT,
    to_status TEXT,
    outcome TEXT,
    reason TEXT,
    provider_message_id TEXT,
    lease_token UUID,
    latency_ms FLOAT,
    detail JSONB DEFAULT '{}'::jsonb NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    CONSTRAINT pk_evidence PRIMARY KEY (step_id, id),
    CONSTRAINT ck_evidence_kind CHECK (kind IN ('attempt_started', 'provider_response', 'late_response', 'attempt_released', 'lease_expired', 'window_closed', 'reconciled', 'operator_resolved', 'notice_enqueued', 'content_redacted', 'delivery_event', 'held', 'approved', 'denied', 'cancelled', 'hold_expired')),
    CONSTRAINT ck_evidence_outcome CHECK (outcome IS NULL OR outcome IN ('accepted', 'rejected', 'retryable', 'unknown')),
    CONSTRAINT ck_evidence_from_status CHECK (from_status IS NULL OR from_status IN ('held', 'pending', 'in_flight', 'retryable', 'unknown', 'accepted', 'rejected')),
    CONSTRAINT ck_evidence_to_status CHECK (to_status IS NULL OR to_status IN ('held', 'pending', 'in_flight', 'retryable', 'unknown', 'accepted', 'rejected')),
    CONSTRAINT ck_evidence_attempt_rows_carry_lease CHECK (kind NOT IN ('attempt_started', 'provider_response', 'late_response') OR (attempt IS NOT NULL AND lease_token IS NOT NULL)),
    CONSTRAINT fk_evidence_step_id_email_steps FOREIGN KEY(step_id) REFERENCES email_steps (id)
)
 PARTITION BY RANGE (step_id);
CREATE INDEX ix_evidence_created_at_brin ON evidence USING brin (created_at) WITH (autosummarize = on);
CREATE UNIQUE INDEX uq_evidence_answer_per_lease ON evidence (step_id, lease_token) WHERE kind IN ('provider_response', 'late_response');
