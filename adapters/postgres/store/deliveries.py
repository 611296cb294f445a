"""Delivery events (worker/ports/deliveries.py): providers' webhooks stored, matched and read."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from evq.adapters.postgres.notices import delivery_notice_op
from evq.adapters.postgres.op_runner import run_async
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store.base import PostgresBase, fetch_all, json_text
from evq.worker import metrics
from evq.worker.delivery import PROVES_ACCEPTED, TELLS_NOTIFY, DeliveryEvent, split_tag
from evq.worker.ports.deliveries import DeliveryRecorded


def settled_message(event: DeliveryEvent) -> str:
    """The step's detail (and the evidence's message) for an event: what the provider said."""
    return f"{event.provider} webhook: {event.type}" + (f" for {event.recipient}" if event.recipient else "")


def delivery_params(
    event: DeliveryEvent, *, actor: str, now: datetime | None, step_providers: Collection[str] = ()
) -> dict[str, Any]:
    # The tag's two parts (worker/delivery.py, key_tag): the key's digest finds the step, the
    # Message-ID's part makes it this installation's; only a well-formed tag is looked up.
    tag = split_tag(event.key_digest)
    return {
        "now": now,
        "step_providers": sorted(step_providers),
        "provider": event.provider,
        "event_id": event.event_id,
        "type": event.type,
        "occurred_at": event.occurred_at,
        # Only a well-formed digest is looked up (anything else cannot be one evq made).
        "digest": bytes.fromhex(tag[0]) if tag else None,
        "message_tag": tag[1] if tag else None,
        "key_digest": event.key_digest,
        "message_id": event.message_id,
        "provider_message_id": event.provider_message_id,
        "recipient": event.recipient,
        "detail": json_text(event.detail),
        "proves": event.type in PROVES_ACCEPTED,
        "message": settled_message(event),
        "actor": actor,
    }


class PostgresDeliveries(PostgresBase):
    """Delivery events: one transaction per event (store, match, settle, evidence, notice)."""

    async def delivery_record(
        self, event: DeliveryEvent, *, actor: str, step_providers: Collection[str], now: datetime | None = None
    ) -> DeliveryRecorded:
        params = delivery_params(event, actor=actor, now=now, step_providers=step_providers)
        notices = 0
        async with self._op("delivery_record") as conn, conn.transaction():
            rows = await fetch_all(conn, Q["delivery_record"], params)
            if not rows:
                # The provider sent this event before (maybe at this very moment, in another
                # transaction: the unique index made this one wait, then write nothing).
                first = await fetch_all(conn, Q["delivery_get"], params)
                return DeliveryRecorded(id=first[0]["id"], step=first[0]["step_id"], duplicate=True, closed=False)
            row = rows[0]
            step = row["step_id"]
            accepted = bool(row["closed"]) or row["status"] == "accepted"
            # Not gated on ``accepted``: that status is this statement's snapshot, and a close
            # committed meanwhile would be missed; the candidate query reads the step's status
            # now (accepted, someone to tell) and makes nothing otherwise.
            if step is not None and event.type in TELLS_NOTIFY:
                stored = {**params, "received_at": row["received_at"]}
                made = await run_async(conn, delivery_notice_op(step, stored, self.notices, actor=actor, now=now))
                notices = len(made)
        closed = bool(row["closed"])
        metrics.observe_delivery(event.provider, event.type, matched=step is not None, settled=closed)
        if closed:
            metrics.observe_closed(row["created_at"], row["closed_at"])
        if event.type == "delivered" and accepted:
            accepted_at = row["closed_at"] if closed else row["accepted_at"]
            metrics.observe_delivered(event.provider, accepted_at, event.occurred_at or row["received_at"])
        return DeliveryRecorded(id=row["id"], step=step, duplicate=False, closed=closed, notices=notices)

    async def delivery_events(
        self,
        *,
        step: int | None = None,
        unmatched: bool = False,
        provider: str | None = None,
        before_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        params = {"step": step, "unmatched": unmatched, "provider": provider, "before_id": before_id}
        return await self._page(
            "delivery_events", Q["delivery_list"], Q["delivery_count"], {**params, "limit": limit, "offset": offset}
        )

    async def delivery_states(self, step_ids: Sequence[int]) -> Mapping[int, Mapping[str, Any]]:
        if not step_ids:
            return {}
        rows = await self._fetch("delivery_states", Q["delivery_states"], {"ids": list(step_ids)})
        return {r["step_id"]: {"state": r["state"], "at": r["at"], "events": r["events"]} for r in rows}
