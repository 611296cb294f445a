"""The tables as SQLAlchemy Core metadata: the one source of evq's tables, constraints and
indexes. The baseline revision runs them rendered (migrations/baseline/tables.sql, written by
`python -m evq.migrations.render`); `alembic check` and tests/integration/test_migrations.py
compare what the migrations build with this, so the two cannot drift. Runtime SQL lives in
queries.sql.

Invariants are CHECK constraints here, not code paths: a bug in any writer (or a
hand-written UPDATE) cannot produce a closed row without closed_at, an in-flight
row without a lease, or a second step with the same key.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    literal,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, JSONB, TIMESTAMP, UUID

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

STATUSES = ("held", "pending", "in_flight", "retryable", "unknown", "accepted", "rejected")
# What email_steps.status holds: every state but in_flight, which is a lease on step_queue.
STORED_STATUSES = tuple(s for s in STATUSES if s != "in_flight")
OUTCOMES = ("accepted", "rejected", "retryable", "unknown")
EVIDENCE_KINDS = (
    "attempt_started",
    "provider_response",
    "late_response",
    "attempt_released",
    "lease_expired",
    "window_closed",
    "reconciled",
    "operator_resolved",
    "notice_enqueued",
    "content_redacted",
    "delivery_event",
    "held",
    "approved",
    "denied",
    "cancelled",
    "hold_expired",
)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


TZ = TIMESTAMP(timezone=True)
NOW = text("now()")

decisions = Table(
    "decisions",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("run_id", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("intent", Text),
    Column("instruction_version", Text),
    Column("prompt_version", Text),
    Column("model", Text),
    Column("tool", Text),
    Column("rationale", JSONB),
    Column("decided_at", TZ),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    # Who asked: the API key's name and public id (never its secret), and the
    # interface the enqueue came through. A Python API enqueue has no key id.
    Column("actor", Text),
    Column("actor_key_id", Text),
    Column("interface", Text),
    Index(None, "run_id", "created_at"),
)

email_steps = Table(
    "email_steps",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("run_id", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("decision_id", BigInteger, ForeignKey("decisions.id"), nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("provider", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("payload_sha256", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("reason", Text),
    Column("detail", Text),
    Column("attempts", Integer, nullable=False, server_default="0"),
    # NULL: the worker's EVQ_MAX_ATTEMPTS decides.
    Column("max_attempts", Integer),
    Column("next_attempt_at", TZ, nullable=False, server_default=NOW),
    # Until when the provider dedupes our key (first attempt + its window); NULL: never.
    Column("dedupe_until", TZ),
    # An earlier attempt may have reached the provider (an ambiguous answer retried under dedupe).
    Column("maybe_delivered", Boolean, nullable=False, server_default=text("false")),
    Column("provider_message_id", Text),
    Column("notify", Text),
    # Set on a failure notice: the step it tells about. A notice never asks for a notice.
    Column("notice_of", BigInteger, ForeignKey("email_steps.id")),
    # When the reconciler may next ask the provider about this unknown row (NULL: now),
    # and how often it has asked; both only bookkeeping for the reconciler.
    Column("reconcile_after", TZ),
    Column("reconcile_checks", Integer, nullable=False, server_default="0"),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    Column("updated_at", TZ, nullable=False, server_default=NOW),
    Column("first_attempt_at", TZ),
    Column("unknown_since", TZ),
    Column("closed_at", TZ),
    UniqueConstraint("idempotency_key"),
    # The Message-ID's uniqueness and the webhook matcher's key digest are the key ledger's
    # (step_keys, below), written once at enqueue: an index here gets a new entry on every
    # transition of the row (each one a non-HOT update), one per send (the claim writes step_queue).
    UniqueConstraint("run_id", "step_id"),
    # Never in_flight: an attempt under way is its step_queue row's lease (below), and this row
    # keeps the state it was claimed from until the attempt's answer is written.
    CheckConstraint(_in("status", STORED_STATUSES), name="status"),
    CheckConstraint("(status IN ('accepted', 'rejected')) = (closed_at IS NOT NULL)", name="closed_iff_terminal"),
    CheckConstraint("(status = 'unknown') = (unknown_since IS NOT NULL)", name="unknown_since_iff_unknown"),
    CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
    CheckConstraint("max_attempts IS NULL OR max_attempts >= 1", name="max_attempts_positive"),
    CheckConstraint("(attempts = 0) = (first_attempt_at IS NULL)", name="first_attempt_iff_attempted"),
    CheckConstraint("payload_sha256 ~ '^[0-9a-f]{64}$'", name="payload_sha256_hex"),
    CheckConstraint("jsonb_typeof(payload) = 'object'", name="payload_object"),
    CheckConstraint("length(idempotency_key) BETWEEN 1 AND 512", name="idempotency_key_length"),
    CheckConstraint("message_id ~ '^<[^<>@[:space:]]+@[^<>@[:space:]]+>$'", name="message_id_format"),
    CheckConstraint("NOT maybe_delivered OR attempts >= 1", name="maybe_delivered_after_attempt"),
    CheckConstraint("notice_of IS NULL OR notify IS NULL", name="notice_never_notifies"),
    CheckConstraint("reconcile_checks >= 0", name="reconcile_checks_nonnegative"),
    # Attempts not charged to the message: those that hit a provider-level fault
    # (worker/circuit.py), and those an operator's requeue forgave.
    Column("uncharged_attempts", Integer, nullable=False, server_default="0"),
    # When the retry budget (EVQ_RETRY_FOR) started counting; NULL: at created_at.
    Column("retry_from", TZ),
    CheckConstraint("uncharged_attempts >= 0 AND uncharged_attempts <= attempts", name="uncharged_within_attempts"),
    # When content retention (EVQ_KEEP_CONTENT) removed the body; NULL: all there.
    # Set only by evq_redact_batch; a redacted step is closed and stays closed.
    Column("content_redacted_at", TZ),
    CheckConstraint(
        "content_redacted_at IS NULL OR status IN ('accepted', 'rejected')", name="redacted_only_when_closed"
    ),
    # Approvals, scheduling and priority (docs/design.md, "Approvals and budgets").
    Column("priority", SmallInteger, nullable=False, server_default="0"),  # high 1, normal 0, low -1
    Column("send_at", TZ),  # not before this time (next_attempt_at starts there)
    Column("held_since", TZ),  # set exactly while held
    Column("hold_expires_at", TZ),  # a held send's expiry (NULL: never)
    Column("hold", JSONB),  # why it was held: the rules and budgets that stopped it
    Column("requested_sha256", Text),  # the agent's payload hash, when an approver corrected the message
    CheckConstraint("(status = 'held') = (held_since IS NOT NULL)", name="held_since_iff_held"),
    CheckConstraint("hold_expires_at IS NULL OR status = 'held'", name="hold_expiry_only_when_held"),
    CheckConstraint("priority BETWEEN -1 AND 1", name="priority_range"),
    CheckConstraint("requested_sha256 IS NULL OR requested_sha256 ~ '^[0-9a-f]{64}$'", name="requested_sha256_hex"),
)

# The approval queue: held rows, oldest first.
Index(
    "ix_email_steps_held",
    email_steps.c.held_since,
    email_steps.c.id,
    postgresql_where=text("status = 'held'"),
)
# Operators and the age metric: unknown rows, oldest first.
Index(
    "ix_email_steps_unknown_since",
    email_steps.c.unknown_since,
    email_steps.c.id,
    postgresql_where=text("status = 'unknown'"),
)
# The foreign key's reverse lookup: prune deletes decisions, and each delete checks
# that no step still points at it. Covering: the search by key name reads a key's
# steps' ids, states and times from the index alone (step_list's `hits`).
Index(
    "ix_email_steps_decision_id",
    email_steps.c.decision_id,
    postgresql_include=["status", "created_at", "unknown_since", "held_since", "id"],
)
# A failure notice's reverse lookup: prune asks whether a notice still points at a
# step, and the notice_of foreign key asks the same for every step deleted.
Index("ix_email_steps_notice_of", email_steps.c.notice_of, postgresql_where=text("notice_of IS NOT NULL"))
# Content retention's work list: closed steps still holding their body, by close
# time; a redacted step leaves it, so a pass reads only what is due.
Index(
    "ix_email_steps_content_due",
    email_steps.c.closed_at,
    email_steps.c.id,
    postgresql_where=text("status IN ('accepted', 'rejected') AND content_redacted_at IS NULL"),
)
# The search box: every recipient address and its "@domain", through the immutable function
# migrations/baseline/search.sql creates (queries.sql's step_list matches with the same expression).
Index("ix_email_steps_recipient_keys", func.evq_recipient_keys(email_steps.c.payload), postgresql_using="gin")
# The provider's message id leads to its step; most rows have none until accepted.
Index(
    "ix_email_steps_provider_message_id",
    email_steps.c.provider_message_id,
    postgresql_where=text("provider_message_id IS NOT NULL"),
)
# Counts by status (the collector), listings, and prune's range of terminal rows.
Index("ix_email_steps_status_created_at", email_steps.c.status, email_steps.c.created_at)

# The queue: one narrow row per step that is owed a send (pending or retryable, and while an
# attempt is under way, its lease), written at enqueue (or approval, or an operator's requeue)
# and deleted when the step leaves the queue (accepted, rejected, unknown). The claim, the
# rescuer and the release write only this row, so a send rewrites the wide email_steps row
# and its indexes once (its answer), not twice; the attempt's counters live here while it
# runs and are copied to email_steps with the answer (docs/design.md, "The queue"). No
# foreign key to email_steps: its check would lock the wide row on every write of this one;
# the claim joins email_steps and takes only a step still pending or retryable there.
step_queue = Table(
    "step_queue",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("provider", Text, nullable=False),
    Column("priority", SmallInteger, nullable=False, server_default="0"),
    Column("next_attempt_at", TZ, nullable=False, server_default=NOW),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("first_attempt_at", TZ),
    Column("dedupe_until", TZ),
    Column("maybe_delivered", Boolean, nullable=False, server_default=text("false")),
    Column("lease_owner", Text),
    Column("lease_token", UUID(as_uuid=True)),
    Column("lease_expires_at", TZ),
    Column("updated_at", TZ, nullable=False, server_default=NOW),
    CheckConstraint(
        "(lease_token IS NULL) = (lease_owner IS NULL) AND (lease_token IS NULL) = (lease_expires_at IS NULL)",
        name="lease_whole",
    ),
    CheckConstraint("lease_token IS NULL OR attempts >= 1", name="lease_counts_attempt"),
    CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
    CheckConstraint("(attempts = 0) = (first_attempt_at IS NULL)", name="first_attempt_iff_attempted"),
    CheckConstraint("NOT maybe_delivered OR attempts >= 1", name="maybe_delivered_after_attempt"),
    CheckConstraint("priority BETWEEN -1 AND 1", name="priority_range"),
)
# The claim's index: rows not under a lease, in the claim's order (higher priority, then due).
Index(
    "ix_step_queue_claimable",
    step_queue.c.priority.desc(),
    step_queue.c.next_attempt_at,
    step_queue.c.id,
    postgresql_where=text("lease_token IS NULL"),
)
# The rescuer's index: leased rows, by lease expiry.
Index(
    "ix_step_queue_lease_expiry",
    step_queue.c.lease_expires_at,
    postgresql_where=text("lease_token IS NOT NULL"),
)
# The dedupe-window closer's (step_close_windows): waiting rows an earlier attempt may have
# delivered, which only a rescue or an ambiguous answer makes; a claim writes no entry here.
Index(
    "ix_step_queue_maybe_delivered",
    step_queue.c.dedupe_until,
    postgresql_where=text("maybe_delivered AND lease_token IS NULL"),
)

# Partitioned by its step's id: a step's whole history lies in one partition, so
# retention drops partitions of closed steps rather than deleting row by row. The
# partitions (evidence_steps_<lo>, and evidence_overflow for a range none covers yet) are
# created by evq_evidence_partitions_ahead, not by this model (migrations/env.py leaves
# them out of the comparison).
evidence = Table(
    "evidence",
    metadata,
    # The primary key holds the partition key, as a partitioned table's unique keys must;
    # it is also the index each read of a step's history uses (step_id = ?, ORDER BY id).
    Column("id", BigInteger, nullable=False, autoincrement=True),
    Column("step_id", BigInteger, ForeignKey("email_steps.id"), nullable=False),
    Column("run_id", Text, nullable=False),
    Column("attempt", Integer),
    Column("kind", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("from_status", Text),
    Column("to_status", Text),
    Column("outcome", Text),
    Column("reason", Text),
    Column("provider_message_id", Text),
    Column("lease_token", UUID(as_uuid=True)),
    Column("latency_ms", Float),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    PrimaryKeyConstraint("step_id", "id"),
    CheckConstraint(_in("kind", EVIDENCE_KINDS), name="kind"),
    CheckConstraint(f"outcome IS NULL OR {_in('outcome', OUTCOMES)}", name="outcome"),
    CheckConstraint(f"from_status IS NULL OR {_in('from_status', STATUSES)}", name="from_status"),
    CheckConstraint(f"to_status IS NULL OR {_in('to_status', STATUSES)}", name="to_status"),
    CheckConstraint(
        "kind NOT IN ('attempt_started', 'provider_response', 'late_response') "
        "OR (attempt IS NOT NULL AND lease_token IS NOT NULL)",
        name="attempt_rows_carry_lease",
    ),
    # A run's evidence is read through its steps (evidence_for_steps), so run_id needs no
    # index of its own: each evidence row costs one entry less.
    postgresql_partition_by="RANGE (step_id)",
)

# One answer per attempt, whether it landed (provider_response) or was fenced out
# (late_response): a retried commit of the same outcome becomes a no-op, not a
# second answer. A lease token is drawn for one step, so (step_id, lease_token) is the
# same rule, in the form a partitioned table can hold.
Index(
    "uq_evidence_answer_per_lease",
    evidence.c.step_id,
    evidence.c.lease_token,
    unique=True,
    postgresql_where=text("kind IN ('provider_response', 'late_response')"),
)

# API keys (worker/keys.py). A name is never reused, so an actor in evidence names
# exactly one key for ever; rotating means a new name, then revoking the old one.
ROLES = ("agent", "operator", "admin")
KEY_APPROVALS = ("always", "policy", "never")

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    # The public part of the key, for a one-row lookup; the secret is only hashed.
    Column("key_id", Text, nullable=False),
    Column("secret_hash", Text, nullable=False),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    # NULL: the bootstrap key, made before any admin key existed.
    Column("created_by", Text),
    Column("revoked_at", TZ),
    Column("revoked_by", Text),
    # Bumped when the key's holder signs out of the ops page: sessions made under an
    # older generation are refused (ops/web/session.py).
    Column("session_generation", Integer, nullable=False, server_default=text("0")),
    # The key's default notification target: told of a failure of a step it
    # enqueued when the request named no notify address.
    Column("notify_email", Text),
    # ...and the URL evq POSTs a signed JSON event to. The signing secret is derived
    # from the pepper and this generation (worker/callbacks.py), never stored.
    Column("notify_url", Text),
    Column("callback_generation", Integer, nullable=False, server_default=text("0")),
    # Whether the key's sends wait for a person (0030, worker/approval_policy.py KeyApproval): always,
    # policy (the installation's rules) or never. No default: every writer states it.
    Column("approval", Text, nullable=False),
    UniqueConstraint("name"),
    UniqueConstraint("key_id"),
    CheckConstraint(_in("role", ROLES), name="role"),
    CheckConstraint("key_id ~ '^[0-9a-f]{12}$'", name="key_id_format"),
    # hmac-sha256: HMAC of the secret under api_key_pepper; scrypt: a key evq 0.1 made,
    # rehashed to HMAC at its first successful use.
    CheckConstraint("secret_hash LIKE 'scrypt$%' OR secret_hash LIKE 'hmac-sha256$%'", name="secret_hash_scheme"),
    CheckConstraint("revoked_by IS NULL OR revoked_at IS NOT NULL", name="revoked_by_when_revoked"),
    CheckConstraint(_in("approval", KEY_APPROVALS), name="approval"),
)

# The server-side secret of API key hashes (worker/keys.py): one row, made by the
# baseline (0.2.0's kept by its upgrade); the runtime role may only read it.
api_key_pepper = Table(
    "api_key_pepper",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False, server_default=text("1")),
    Column("pepper", BYTEA, nullable=False),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    # The first step id whose provider idempotency key is keyed by a secret derived from the
    # pepper (adapters/http/provider.py::WireKeys); steps below it (evq 0.2.0's) keep the form they
    # may already have been sent under.
    Column("wire_keys_from", BigInteger, nullable=False),
    CheckConstraint("id = 1", name="one_row"),
    CheckConstraint("octet_length(pepper) >= 32", name="long_enough"),
    CheckConstraint("wire_keys_from >= 1", name="wire_keys_from_positive"),
)

# What evq prune removed, one row per batch, written in the batch's own transaction
# (so it matches exactly what was deleted). Append-only, like evidence.
prune_log = Table(
    "prune_log",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("run", UUID(as_uuid=True), nullable=False),
    Column("batch", Integer, nullable=False),
    Column("actor", Text, nullable=False),
    Column("cutoff", TZ, nullable=False),
    Column("steps", Integer, nullable=False),
    Column("evidence", BigInteger, nullable=False),  # a dropped partition's rows can pass 2**31
    Column("decisions", Integer, nullable=False),
    Column("first_step_id", BigInteger),
    Column("last_step_id", BigInteger),
    # Set when the row logs a dropped evidence partition: its name; first_step_id and
    # last_step_id are then its whole range, and the steps follow in later batches.
    Column("evidence_partition", Text),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    UniqueConstraint("run", "batch"),
    CheckConstraint("steps >= 0 AND evidence >= 0 AND decisions >= 0", name="counts_nonnegative"),
)
# The overflow partition's guard asks, for each row it takes, whether a dropped
# partition held that step id: only the dropped partitions' rows, out of a row per batch.
Index(
    "ix_prune_log_dropped_ranges",
    prune_log.c.first_step_id,
    prune_log.c.last_step_id,
    postgresql_where=prune_log.c.evidence_partition.isnot(None),
)

# One token bucket per provider, shared by every worker on every host (worker/ratelimit.py).
# Operational state, not history: rewritten on every take, never evidence.
provider_rate_limits = Table(
    "provider_rate_limits",
    metadata,
    Column("provider", Text, primary_key=True),
    # Whole tokens are granted; the fraction is the refill carried to the next take.
    Column("tokens", Float, nullable=False),
    # When `tokens` was last brought up to date (the database clock).
    Column("refilled_at", TZ, nullable=False, server_default=NOW),
    # Set by a "too fast" answer (HTTP 429 + Retry-After): no worker claims for it before then.
    Column("paused_until", TZ),
    CheckConstraint("tokens >= 0", name="tokens_not_negative"),
)

# Per-provider circuit breaker (worker/circuit.py), one row per provider whose circuit
# ever opened; no row means closed. Operational state, rewritten on every change.
CIRCUIT_STATES = ("closed", "half_open", "open")

provider_circuits = Table(
    "provider_circuits",
    metadata,
    Column("provider", Text, primary_key=True),
    Column("state", Text, nullable=False),
    # Why it opened: a fault name (connection_refused, auth_failed, ...) or consecutive_failures.
    Column("reason", Text),
    # The provider's answer that opened it, as the adapter reported it (scrubbed of secrets).
    Column("detail", Text),
    Column("opened_at", TZ),
    # Open: no probe before then.
    Column("probe_at", TZ),
    # Failed probes since it opened: the exponent of the probe backoff.
    Column("probes", Integer, nullable=False, server_default="0"),
    # Half-open: the worker whose probe is out, and until when it holds it.
    Column("probe_owner", Text),
    Column("probe_expires_at", TZ),
    Column("updated_at", TZ, nullable=False, server_default=NOW),
    CheckConstraint(_in("state", CIRCUIT_STATES), name="state"),
    CheckConstraint("(state = 'closed') = (opened_at IS NULL)", name="opened_iff_not_closed"),
    CheckConstraint("(state = 'open') = (probe_at IS NOT NULL)", name="probe_at_iff_open"),
    CheckConstraint(
        "(state = 'half_open') = (probe_owner IS NOT NULL AND probe_expires_at IS NOT NULL)",
        name="probe_held_iff_half_open",
    ),
    CheckConstraint("probes >= 0", name="probes_nonnegative"),
)

# Every change of a circuit: append-only like evidence (the same trigger).
provider_circuit_events = Table(
    "provider_circuit_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("provider", Text, nullable=False),
    Column("from_state", Text, nullable=False),
    Column("to_state", Text, nullable=False),
    Column("reason", Text),
    Column("detail", Text),
    Column("actor", Text, nullable=False),
    # Opened: seconds until its next probe.
    Column("probe_in", Float),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    CheckConstraint(_in("from_state", CIRCUIT_STATES), name="from_state"),
    CheckConstraint(_in("to_state", CIRCUIT_STATES), name="to_state"),
    Index(None, "provider", "id"),
)

# Refused enqueues (worker/refusals.py): what agents tried and why it was refused,
# bounded and scrubbed (identifiers, field names, a digest and size; never the body
# or the key). Pruned by `evq prune` with the history it keeps.
REFUSAL_INTERFACES = ("cli", "http", "mcp", "python")

enqueue_refusals = Table(
    "enqueue_refusals",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    Column("interface", Text, nullable=False),
    # The API key's name (never the key); NULL when the caller showed no valid key.
    Column("key_name", Text),
    Column("dry_run", Boolean, nullable=False, server_default=text("false")),
    # How many requests the refused call held, and the digest and size of their canonical JSON.
    Column("requests", Integer, nullable=False),
    Column("request_bytes", BigInteger, nullable=False),
    Column("request_sha256", Text, nullable=False),
    # [{field, message}], the first 50; error_count says how many there were.
    Column("errors", JSONB, nullable=False),
    Column("error_count", Integer, nullable=False),
    # The failing fields' roots (to, decision, ...): the counter's labels.
    Column("reasons", ARRAY(Text), nullable=False),
    # Per request (the first 10): run_id, step_id, provider, the field names given, recipients.
    Column("asked", JSONB, nullable=False),
    CheckConstraint(_in("interface", REFUSAL_INTERFACES), name="interface"),
    CheckConstraint("requests >= 0 AND request_bytes >= 0 AND error_count >= 0", name="counts_nonnegative"),
    CheckConstraint("length(request_sha256) = 64", name="sha256_length"),
    # Bounded, whatever writes the row.
    CheckConstraint("pg_column_size(errors) + pg_column_size(asked) <= 65536", name="bounded"),
    Index(None, "created_at"),
)

# The database-wide counter behind evq_enqueue_refusals_total{interface,field}: one row per
# label pair, incremented with each refusal and never pruned, so it only ever grows.
enqueue_refusal_counts = Table(
    "enqueue_refusal_counts",
    metadata,
    Column("interface", Text, primary_key=True),
    Column("field", Text, primary_key=True),
    Column("total", BigInteger, nullable=False),
    CheckConstraint("total >= 0", name="total_nonnegative"),
)

# What became of each key's sends: every rejection, unknown and operator verdict
# on a step the key enqueued, append-only, written by a trigger on evidence (so every
# path that closes a step writes it). The id is the feed's cursor. key_id NULL: a step
# enqueued without a key (the Python API). No foreign key: prune keeps the feed.
KEY_EVENT_KINDS = ("rejected", "unknown", "verdict")

key_events = Table(
    "key_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("key_id", Text),
    Column("kind", Text, nullable=False),
    Column("step", BigInteger, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("status", Text),
    Column("reason", Text),
    Column("detail", Text),
    Column("actor", Text, nullable=False),
    Column("evidence_id", BigInteger, nullable=False),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    CheckConstraint(_in("kind", KEY_EVENT_KINDS), name="kind"),
    Index(None, "key_id", "id"),
)

# The events owed to a key's callback URL: written with the event by the same
# trigger, so a POST is durable before it is tried; retried with backoff until delivered
# or given up (worker/callbacks.py). Queue state: nothing secret (the URL stays on the key).
CALLBACK_STATUSES = ("pending", "delivered", "failed")

callback_deliveries = Table(
    "callback_deliveries",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", BigInteger, ForeignKey("key_events.id"), nullable=False),
    Column("key_id", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", TZ, nullable=False, server_default=NOW),
    Column("last_status", Integer),
    Column("last_error", Text),
    Column("delivered_at", TZ),
    Column("created_at", TZ, nullable=False, server_default=NOW),
    Column("updated_at", TZ, nullable=False, server_default=NOW),
    UniqueConstraint("event_id"),
    CheckConstraint(_in("status", CALLBACK_STATUSES), name="status"),
    CheckConstraint("(status = 'delivered') = (delivered_at IS NOT NULL)", name="delivered_iff_delivered_at"),
    CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
)
Index(
    "ix_callback_deliveries_due",
    callback_deliveries.c.next_attempt_at,
    callback_deliveries.c.id,
    postgresql_where=text("status = 'pending'"),
)

# One row per running worker: upserted every few seconds, deleted when it stops;
# what `evq admin health` reads to say whether workers run.
worker_heartbeats = Table(
    "worker_heartbeats",
    metadata,
    Column("owner", Text, primary_key=True),
    Column("providers", ARRAY(Text), nullable=False, server_default="{}"),
    Column("started_at", TZ, nullable=False, server_default=NOW),
    Column("seen_at", TZ, nullable=False, server_default=NOW),
)

# What providers' webhooks say became of each message (worker/delivery.py):
# append-only, deduplicated by the provider's event id, matched to a step by key digest
# or Message-ID (step_id NULL: matched none, kept for an operator). No foreign key:
# pruning a step keeps what its provider said, as key_events does.
DELIVERY_TYPES = ("delivered", "deferred", "bounced_hard", "bounced_soft", "complained", "opened", "clicked")

delivery_events = Table(
    "delivery_events",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("provider", Text, nullable=False),
    Column("event_id", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("occurred_at", TZ),
    Column("received_at", TZ, nullable=False, server_default=NOW),
    Column("step_id", BigInteger),
    Column("key_digest", Text),
    Column("message_id", Text),
    Column("provider_message_id", Text),
    Column("recipient", Text),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    UniqueConstraint("provider", "event_id"),
    CheckConstraint(_in("type", DELIVERY_TYPES), name="type"),
    Index(None, "step_id", "id"),
)
# The operators' list of events that matched no step, newest first.
Index("ix_delivery_events_unmatched", delivery_events.c.id, postgresql_where=text("step_id IS NULL"))

# Blast-radius budgets (worker/approval_policy.py): one counter per (budget, scope, window),
# incremented under the row's lock in the enqueue's own transaction, so concurrent enqueues
# cannot together pass a cap. ``scope`` is the run, key or recipient domain the cap is about;
# ``window_start`` the fixed hour or day it counts (a run's budget has one window).
send_budgets = Table(
    "send_budgets",
    metadata,
    Column("budget", Text, primary_key=True),
    Column("scope", Text, primary_key=True),
    Column("window_start", TZ, primary_key=True),
    Column("used", Integer, nullable=False, server_default="0"),
    Column("updated_at", TZ, nullable=False, server_default=NOW),
    CheckConstraint("used >= 0", name="used_nonnegative"),
)

# The first-contact rule's memory: who each sender was allowed to mail, an address or
# ``@domain``; written when a send to them was enqueued without a hold or approved.
known_recipients = Table(
    "known_recipients",
    metadata,
    Column("sender", Text, primary_key=True),
    Column("recipient", Text, primary_key=True),
    Column("first_step_id", BigInteger),
    Column("created_at", TZ, nullable=False, server_default=NOW),
)

# The enqueuing API key's name, for the search box; with the id, so the search
# by key name reads its decisions' ids from the index alone.
Index("ix_decisions_actor", decisions.c.actor, decisions.c.id, postgresql_where=text("actor IS NOT NULL"))
# The charts' read of recent evidence by time: append-only rows in time order, so BRIN.
Index(
    "ix_evidence_created_at_brin",
    evidence.c.created_at,
    postgresql_using="brin",
    postgresql_with={"autosummarize": "on"},
)

# The queue's figures once a minute: what the ops page's charts draw "better or worse?"
# from, one row per minute (the first writer's), deleted after the kept window.
queue_samples = Table(
    "queue_samples",
    metadata,
    Column("at", TZ, primary_key=True),
    Column("pending", Integer, nullable=False),
    Column("claimable", Integer, nullable=False),
    Column("lag_seconds", Float, nullable=False),
    Column("in_flight", Integer, nullable=False),
    Column("retryable", Integer, nullable=False),
    Column("unknown", Integer, nullable=False),
    Column("unknown_oldest_seconds", Float),
    Column("held", Integer, nullable=False),
    Column("sampled_by", Text, nullable=False),
    CheckConstraint("at = date_trunc('minute', at)", name="at_minute"),
)

# The sends the charts count, per minute x provider x outcome: written by the sampler
# for complete minutes only, so a chart reads minutes instead of every evidence row.
send_rollups = Table(
    "send_rollups",
    metadata,
    Column("minute", TZ, primary_key=True),
    Column("provider", Text, primary_key=True),
    Column("outcome", Text, primary_key=True),
    Column("n", BigInteger, nullable=False),
    CheckConstraint("minute = date_trunc('minute', minute)", name="minute"),
)

# Which minutes send_rollups holds: every minute in [since, upto), empty ones too.
send_rollup_watermark = Table(
    "send_rollup_watermark",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("since", TZ, nullable=False),
    Column("upto", TZ, nullable=False),
    CheckConstraint("id", name="one_row"),
)

# The key ledger (invariant 12): what answers a repeat of every idempotency key ever
# used, written with the step by the enqueue statement (insert-once; the runtime role may
# insert only the columns an enqueue writes) and never deleted. evq_prune_batch writes the
# step's end (status, reason, closed_at, pruned_at) in the transaction that deletes it, so a
# repeat of a pruned key is answered as the step ended, never sent again. Its primary key is
# where every enqueue of a key meets every other and the prune. Digests as 32 raw bytes, not
# hex: the table is kept for ever (docs/scaling.md, "The key ledger").
step_keys = Table(
    "step_keys",
    metadata,
    Column("idempotency_key", Text, primary_key=True),
    Column("id", BigInteger, nullable=False),
    Column("run_id", Text, nullable=False),
    Column("step_id", Text, nullable=False),
    Column("message_id", Text, nullable=False),
    Column("provider", Text, nullable=False),
    # The agent's own request (an approver's correction is corrected_sha256, written at prune).
    Column("payload_sha256", BYTEA, nullable=False),
    Column("created_at", TZ, nullable=False),
    Column("status", Text),
    Column("reason", Text),
    Column("maybe_delivered", Boolean),
    Column("corrected_sha256", BYTEA),
    Column("closed_at", TZ),
    Column("pruned_at", TZ),
    CheckConstraint("length(payload_sha256) = 32", name="payload_sha256_bytes"),
    CheckConstraint("corrected_sha256 IS NULL OR length(corrected_sha256) = 32", name="corrected_sha256_bytes"),
    CheckConstraint("status IS NULL OR status IN ('accepted', 'rejected')", name="status"),
    CheckConstraint(
        "(pruned_at IS NULL) = (status IS NULL) AND (pruned_at IS NULL) = (closed_at IS NULL)",
        name="pruned_with_its_end",
    ),
)
# `evq steps show` of a pruned step's id (step_pruned in queries.sql): the one read by id.
Index(None, step_keys.c.id)
# A Message-ID names one step (a webhook's event matched by it, delivery_record; the search
# box's Message-ID, step_list and step_count_by_status). On the ledger, written once at
# enqueue, not on email_steps, whose every transition would write it again. Partial: only
# the keys of steps still kept, as on email_steps before; the prune's update of the row leaves
# it and VACUUM takes its entry, so the two indexes do not grow with the ledger for ever.
# Message-IDs begin with their enqueue time (worker/enqueue.py, new_message_id), so inserts
# land at the index's right edge.
Index(
    "uq_step_keys_message_id",
    step_keys.c.message_id,
    unique=True,
    postgresql_where=text("pruned_at IS NULL"),
)
# A webhook's event matched by the key digest it echoes (delivery_record): the SHA-256 of the
# key's bytes (UTF-8: the baseline refuses another encoding), built-ins only, so the enqueue
# statement writes nothing more and the digest can never disagree with the key. Hash:
# equality is all it is asked. On the ledger and partial, for the reasons above.
Index(
    "ix_step_keys_key_sha256",
    func.sha256(
        func.decode(
            func.replace(step_keys.c.idempotency_key, literal("\\"), literal("\\\\")),
            literal("escape"),
        )
    ),
    postgresql_using="hash",
    postgresql_where=text("pruned_at IS NULL"),
)
