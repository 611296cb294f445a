"""A step's tables, the send path: the decision behind it, the step itself (email_steps), its
queue row while a send is owed (step_queue), its evidence, and the key ledger that answers
every repeat of its idempotency key (step_keys). The states and outcomes their CHECKs allow
are here too.
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
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    literal,
    text,
)
from sqlalchemy.dialects.postgresql import BYTEA, JSONB, UUID

from evq.adapters.postgres.tables.base import NOW, TZ, metadata, one_of

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
# The enqueuing API key's name, for the search box; with the id, so the search
# by key name reads its decisions' ids from the index alone.
Index("ix_decisions_actor", decisions.c.actor, decisions.c.id, postgresql_where=text("actor IS NOT NULL"))

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
    CheckConstraint(one_of("status", STORED_STATUSES), name="status"),
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
    CheckConstraint(one_of("kind", EVIDENCE_KINDS), name="kind"),
    CheckConstraint(f"outcome IS NULL OR {one_of('outcome', OUTCOMES)}", name="outcome"),
    CheckConstraint(f"from_status IS NULL OR {one_of('from_status', STATUSES)}", name="from_status"),
    CheckConstraint(f"to_status IS NULL OR {one_of('to_status', STATUSES)}", name="to_status"),
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
# The charts' read of recent evidence by time: append-only rows in time order, so BRIN.
Index(
    "ix_evidence_created_at_brin",
    evidence.c.created_at,
    postgresql_using="brin",
    postgresql_with={"autosummarize": "on"},
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
