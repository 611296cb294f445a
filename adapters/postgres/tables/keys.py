"""API keys and what they are told: the keys themselves, the pepper their secrets are hashed
under, the feed of what became of each key's sends (key_events) and the callbacks owed to a
key's URL (callback_deliveries).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import BYTEA

from evq.adapters.postgres.tables.base import NOW, TZ, metadata, one_of

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
    CheckConstraint(one_of("role", ROLES), name="role"),
    CheckConstraint("key_id ~ '^[0-9a-f]{12}$'", name="key_id_format"),
    # hmac-sha256: HMAC of the secret under api_key_pepper; scrypt: a key evq 0.1 made,
    # rehashed to HMAC at its first successful use.
    CheckConstraint("secret_hash LIKE 'scrypt$%' OR secret_hash LIKE 'hmac-sha256$%'", name="secret_hash_scheme"),
    CheckConstraint("revoked_by IS NULL OR revoked_at IS NOT NULL", name="revoked_by_when_revoked"),
    CheckConstraint(one_of("approval", KEY_APPROVALS), name="approval"),
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
    CheckConstraint(one_of("kind", KEY_EVENT_KINDS), name="kind"),
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
    CheckConstraint(one_of("status", CALLBACK_STATUSES), name="status"),
    CheckConstraint("(status = 'delivered') = (delivered_at IS NOT NULL)", name="delivered_iff_delivered_at"),
    CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
)
Index(
    "ix_callback_deliveries_due",
    callback_deliveries.c.next_attempt_at,
    callback_deliveries.c.id,
    postgresql_where=text("status = 'pending'"),
)
