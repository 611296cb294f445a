"""The PostgreSQL store: the core's Store port (worker/ports) over one psycopg async pool.

Split by port, one module per role, each a mixin of :class:`PostgresBase` (base.py: the
pool, the chokepoint every call passes, transactions); every statement is in
adapters/postgres/queries.sql.
"""

from __future__ import annotations

from evq.adapters.postgres.store.approvals import PostgresApprovals
from evq.adapters.postgres.store.base import PostgresBase
from evq.adapters.postgres.store.charts import PostgresCharts
from evq.adapters.postgres.store.circuits import PostgresCircuits
from evq.adapters.postgres.store.deliveries import PostgresDeliveries
from evq.adapters.postgres.store.heartbeats import PostgresHeartbeats
from evq.adapters.postgres.store.keys import PostgresKeys
from evq.adapters.postgres.store.prune import PostgresPrune
from evq.adapters.postgres.store.queue import PostgresQueue, new_claim_id
from evq.adapters.postgres.store.rates import PostgresRates
from evq.adapters.postgres.store.reconcile import PostgresReconcile
from evq.adapters.postgres.store.redact import PostgresRedact
from evq.adapters.postgres.store.refusals import PostgresRefusals
from evq.adapters.postgres.store.steps import PostgresSteps

__all__ = ["PostgresBase", "PostgresStore", "new_claim_id"]


class PostgresStore(
    PostgresQueue,
    PostgresRates,
    PostgresCircuits,
    PostgresReconcile,
    PostgresPrune,
    PostgresRedact,
    PostgresSteps,
    PostgresApprovals,
    PostgresKeys,
    PostgresRefusals,
    PostgresHeartbeats,
    PostgresDeliveries,
    PostgresCharts,
):
    """Every port over one pool: the worker's queue (claim, record, release, rescue), rates,
    circuits, the reconciler, pruning, content retention, the app's steps (enqueue, reads, resolve),
    API keys, refused enqueues, delivery events (providers' webhooks) the queue sampler and the overview's chart reads, and the workers' heartbeats (which ops/wiring.py writes beside the
    core's loop).
    ``PostgresStore.open(url)`` opens the pool (PostgresBase.open)."""
