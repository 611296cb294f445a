"""The tables as SQLAlchemy Core metadata: the one source of evq's tables, constraints and
indexes. The baseline revision runs them rendered (migrations/baseline/tables.sql, written by
`python -m evq.migrations.render`); `alembic check` and tests/integration/test_migrations.py
compare what the migrations build with this, so the two cannot drift. Runtime SQL lives in
queries.sql.

Invariants are CHECK constraints in the model, not code paths: a bug in any writer (or a
hand-written UPDATE) cannot produce a closed row without closed_at, an in-flight
row without a lease, or a second step with the same key.

The tables are defined in tables/, one module per group by what they hold: steps.py (the send
path: decisions, email_steps, step_queue, evidence, step_keys), keys.py (API keys and their
feeds), bookkeeping.py (the operators' and the worker's state and history), all on the one
``metadata`` of tables/base.py. This module imports every group, so importing it registers
every table on ``metadata``: what migrations/render.py renders and migrations/env.py compares.
Every table and constant is importable from here, as it was when the model was one file.
"""

from __future__ import annotations

from evq.adapters.postgres.tables.base import NAMING, NOW, TZ, metadata
from evq.adapters.postgres.tables.bookkeeping import (
    CIRCUIT_STATES,
    DELIVERY_TYPES,
    REFUSAL_INTERFACES,
    delivery_events,
    enqueue_refusal_counts,
    enqueue_refusals,
    known_recipients,
    provider_circuit_events,
    provider_circuits,
    provider_rate_limits,
    prune_log,
    queue_samples,
    send_budgets,
    send_rollup_watermark,
    send_rollups,
    worker_heartbeats,
)
from evq.adapters.postgres.tables.keys import (
    CALLBACK_STATUSES,
    KEY_APPROVALS,
    KEY_EVENT_KINDS,
    ROLES,
    api_key_pepper,
    api_keys,
    callback_deliveries,
    key_events,
)
from evq.adapters.postgres.tables.steps import (
    EVIDENCE_KINDS,
    OUTCOMES,
    STATUSES,
    STORED_STATUSES,
    decisions,
    email_steps,
    evidence,
    step_keys,
    step_queue,
)

__all__ = [
    "CALLBACK_STATUSES",
    "CIRCUIT_STATES",
    "DELIVERY_TYPES",
    "EVIDENCE_KINDS",
    "KEY_APPROVALS",
    "KEY_EVENT_KINDS",
    "NAMING",
    "NOW",
    "OUTCOMES",
    "REFUSAL_INTERFACES",
    "ROLES",
    "STATUSES",
    "STORED_STATUSES",
    "TZ",
    "api_key_pepper",
    "api_keys",
    "callback_deliveries",
    "decisions",
    "delivery_events",
    "email_steps",
    "enqueue_refusal_counts",
    "enqueue_refusals",
    "evidence",
    "key_events",
    "known_recipients",
    "metadata",
    "provider_circuit_events",
    "provider_circuits",
    "provider_rate_limits",
    "prune_log",
    "queue_samples",
    "send_budgets",
    "send_rollup_watermark",
    "send_rollups",
    "step_keys",
    "step_queue",
    "worker_heartbeats",
]
