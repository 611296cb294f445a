"""Delivery events: what a provider's webhook says became of a message it took.

``accepted`` only means the provider took the request. Its webhooks then say whether the
message was delivered, deferred, bounced or marked as spam. Each provider's webhook is
verified and translated by its adapter (adapters/webhooks/) into :class:`DeliveryEvent`;
the store keeps every one append-only (table ``delivery_events``), deduplicated by the
provider's event id, matched to its step by the values evq put on the message:

- ``key_digest``: the value of the tag / metadata / custom argument named ``evq_key`` that evq
  sends with every message (:func:`key_tag`): the SHA-256 hex digest of the step's idempotency
  key (never the key itself: recipients and the provider's dashboards would read the caller's
  run and step ids in it), a hyphen, and 12 hex digits of the digest of the step's Message-ID.
  The key's digest alone is the same for every installation that uses the key, and keys like
  ``run-1:welcome`` are common: two installations sharing a provider account (whose webhooks
  report every message of the account) took each other's events for their own, and an event
  about their message closed our ``unknown`` step ``accepted``. The Message-ID is random per
  step, so the pair names one step of one installation; the store finds the step by the key's
  digest (an index) and then requires the Message-ID's part to agree. A bare digest (what evq
  0.2.0 sent) names only a step 0.2.0 made (an id below ``api_key_pepper.wire_keys_from``);
- ``message_id``: the RFC 5322 Message-ID evq gave the message (``<...@...>``).

Any event about a message proves the provider had it, so an event for an ``unknown`` step
closes it ``accepted`` (reason ``webhook``) with the event as evidence, as the reconciler
does with a lookup. An event that matches no step is kept for an operator, never dropped.
"""

from __future__ import annotations

import hashlib
import re
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


# How many hex digits of the Message-ID's digest the tag carries: 48 bits, within Postmark's
# 80 characters of a metadata value with the key's 64 and the hyphen.
MESSAGE_TAG_HEX: Final = 12


def key_digest(idempotency_key: str) -> str:
    """A step's key's SHA-256, in hex: the first part of its ``evq_key`` tag (the whole tag of a
    step evq 0.2.0 made)."""
    return hashlib.sha256(idempotency_key.encode()).hexdigest()


def message_tag(message_id: str) -> str:
    """The second part of a step's ``evq_key`` tag: what makes it this installation's step."""
    return hashlib.sha256(message_id.encode()).hexdigest()[:MESSAGE_TAG_HEX]


def key_tag(idempotency_key: str, message_id: str) -> str:
    """The value of the ``evq_key`` tag evq sends with a step's message: the same on every
    attempt (both parts are fixed at enqueue), and another installation's step with the same
    key has another."""
    return f"{key_digest(idempotency_key)}-{message_tag(message_id)}"


def split_tag(value: str | None) -> tuple[str, str | None] | None:
    """An ``evq_key`` value as (the key's digest, the Message-ID's part or None for a bare
    digest), or None if it is neither form evq sends."""
    found = _TAG.match((value or "").strip().lower())
    return (found.group(1), found.group(2)) if found else None


_TAG = re.compile(rf"^([0-9a-f]{{64}})(?:-([0-9a-f]{{{MESSAGE_TAG_HEX}}}))?$")


@dataclass(frozen=True, slots=True)
class DeliveryEvent:
    """One verified event from a provider's webhook, in evq's words."""

    provider: str  # the webhook's provider: resend, sendgrid, postmark, mailgun, ses
    event_id: str  # the provider's id of the event (deduplication); derived when it has none
    type: DeliveryType
    occurred_at: datetime | None = None  # when the provider says it happened
    key_digest: str | None = None  # the evq_key value the event echoes (key_tag's form), if any
    message_id: str | None = None  # our Message-ID (``<...@...>``), if the event echoes it
    provider_message_id: str | None = None  # the provider's id of the message
    recipient: str | None = None  # the address the event is about
    # The provider's event, trimmed, scrubbed and free of secrets: kept as evidence.
    detail: dict[str, Any] = field(default_factory=dict)
