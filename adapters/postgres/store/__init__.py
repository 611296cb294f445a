"""The PostgreSQL store (being split by port; see base.py)."""

from evq.adapters.postgres.store.base import PostgresStore, new_claim_id

__all__ = ["PostgresStore", "new_claim_id"]
