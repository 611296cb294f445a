"""Delivery events (worker/delivery.py): what providers' webhooks said, stored, matched, read back."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Protocol

from evq.worker.delivery import DeliveryEvent


@dataclass(frozen=True, slots=True)
class DeliveryRecorded:
    """What :meth:`DeliveryStore.delivery_record` did with one event."""

    id: int  # the event's row (for a duplicate: the row stored first)
    step: int | None  # the step it matched (email_steps.id), None when none did
    duplicate: bool  # the provider sent this event before: nothing changed
    closed: bool  # it closed an unknown step as accepted (reason webhook)
    notices: int = 0  # notices enqueued for it (a hard bounce or complaint told notify)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class DeliveryStore(Protocol):
    async def delivery_record(
        self, event: DeliveryEvent, *, actor: str, step_providers: Collection[str], now: datetime | None = None
    ) -> DeliveryRecorded:
        """Store one verified event and act on it, in one transaction: insert it (a second
        event with the same provider and event id changes nothing and says ``duplicate``);
        match its step by key digest, then by Message-ID, among the steps whose provider is in
        ``step_providers`` (those the event's webhook can report on; an event naming only
        another provider's step is stored unmatched, its detail's ``not_matched`` saying which
        step and why, and nothing is done to that step); leave ``delivery_event`` evidence on
        that step; close the step ``accepted`` (reason ``webhook``) when it is still
        ``unknown`` and the type proves the provider had it (PROVES_ACCEPTED); and, for a
        type that tells notify (TELLS_NOTIFY) on an accepted step with a notify address,
        enqueue one notice per step and type."""
        ...

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
        """Events newest first (by id), ``offset`` of them skipped, at most ``limit``: of one
        step, or those that matched none (``unmatched``), of one provider, with an id below
        ``before_id`` (the next page); and how many match, counted up to COUNT_CAP + 1, of the
        same snapshot as the page. Each row: id, provider, event_id, type, occurred_at,
        received_at, step (None when unmatched), run_id and step_id of that step, key_digest,
        message_id, provider_message_id, recipient, detail."""
        ...

    async def delivery_states(self, step_ids: Sequence[int]) -> Mapping[int, Mapping[str, Any]]:
        """Each step's latest delivery state, for those that have an event: {state (the
        latest event's type, by when it happened), at, events (how many)}, by step id."""
        ...
