"""The operators' and the worker's bookkeeping: each provider's rate limit and circuit, the
workers' heartbeats, refused enqueues, what providers' webhooks said (delivery_events), the
approval rules' budgets and known recipients, the charts' samples and rollups, and what
prune removed (prune_log). None of it is a step's own row.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    Index,
    Integer,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from evq.adapters.postgres.tables.base import NOW, TZ, metadata, one_of

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
    CheckConstraint(one_of("state", CIRCUIT_STATES), name="state"),
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
    CheckConstraint(one_of("from_state", CIRCUIT_STATES), name="from_state"),
    CheckConstraint(one_of("to_state", CIRCUIT_STATES), name="to_state"),
    Index(None, "provider", "id"),
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
    CheckConstraint(one_of("interface", REFUSAL_INTERFACES), name="interface"),
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
    CheckConstraint(one_of("type", DELIVERY_TYPES), name="type"),
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
