"""Delivery events: what a provider's webhook says became of a message it took.

``accepted`` only means the provider took the request. Its webhooks then say whether the
message was delivered, deferred, bounced or marked as spam. Each provider's webhook is
verified and translated by its adapter (adapters/webhooks/) into :class:`DeliveryEvent`;
the store keeps every one append-only (table ``delivery_events``), deduplicated by the
provider's event id, matched to its step by the values evq put on the message:

- ``key_digest``: the SHA-256 hex digest of the step's idempotency key, which evq sends as
  a tag / metadata / custom argument named ``evq_key`` (never the key itself: recipients
  and the provider's dashboards would read the caller's run and step ids in it);
- ``message_id``: the RFC 5322 Message-ID evq gave the message (``<...@...>``).

Any event about a message proves the provider had it, so an event for an ``unknown`` step
closes it ``accepted`` (reason ``webhook``) with the event as evidence, as the reconciler
does with a lookup. An event that matches no step is kept for an operator, never dropped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, TypeAlias

# The tag / metadata name that carries the key digest on every provider.
KEY_TAG: Final = "evq_key"

DeliveryType: TypeAlias = Literal[
    "delivered", "deferred", "bounced_hard", "bounced_soft", "complained", "opened", "clicked"
]
DELIVERY_TYPES: Final[tuple[DeliveryType, ...]] = (
    "delivered",
    "deferred",
    "bounced_hard",
    "bounced_soft",
    "complained",
    "opened",
    "clicked",
)
# The events that mean the provider had the message, so an unknown step was accepted.
# Every type does: a message cannot be delivered, deferred, bounced, complained about,
# opened or clicked unless the provider took it.
PROVES_ACCEPTED: Final[frozenset[str]] = frozenset(DELIVERY_TYPES)
# The events that tell the step's ``notify`` address (worker/notices.py): the recipient is
# gone for good, or called the message spam; providers suspend accounts over both.
TELLS_NOTIFY: Final[frozenset[str]] = frozenset({"bounced_hard", "complained"})


def key_digest(idempotency_key: str) -> str:
    """The value of the ``evq_key`` tag for a step's key: its SHA-256, in hex."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class DeliveryEvent:
    """One verified event from a provider's webhook, in evq's words."""

    provider: str  # the webhook's provider: resend, sendgrid, postmark, mailgun, ses
    event_id: str  # the provider's id of the event (deduplication); derived when it has none
    type: DeliveryType
    occurred_at: datetime | None = None  # when the provider says it happened
    key_digest: str | None = None  # the evq_key value the event echoes, if any
    message_id: str | None = None  # our Message-ID (``<...@...>``), if the event echoes it
    provider_message_id: str | None = None  # the provider's id of the message
    recipient: str | None = None  # the address the event is about
    # The provider's event, trimmed, scrubbed and free of secrets: kept as evidence.
    detail: dict[str, Any] = field(default_factory=dict)
