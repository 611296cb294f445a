"""What the core asks of an email provider adapter: one send, and optionally a lookup.

Implemented by adapters/smtp.py, adapters/http.py (both) and adapters/null.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from evq.worker.outcomes import Outcome


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Everything an adapter may use for one attempt. Key and Message-ID never change."""

    step_id: int
    run_id: str
    idempotency_key: str
    message_id: str
    attempt: int
    payload: Mapping[str, Any]
    # Monotonic instants (worker/deadline.py): the whole exchange ends by ``deadline``;
    # the irreversible step (SMTP's final ".", writing the HTTP request) never begins
    # after ``send_by``. None: no limit beyond the adapter's own timeouts.
    deadline: float | None = None
    send_by: float | None = None


@dataclass(frozen=True, slots=True)
class ProviderProfile:
    """What a provider can do to settle a send whose answer was lost (docs/design.md,
    "Provider profiles"). An adapter may declare one as its ``profile`` attribute;
    :func:`profile_of` derives it otherwise.

    ``dedupe_window``: seconds the provider honours our idempotency key (None: it does not);
    ``lookup_by``: what a lookup finds a message by (``key_tag``, ``message_id``), empty when
    messages cannot be looked up; ``webhook_events``: the delivery types
    (worker/delivery.py) its webhooks send, empty when it sends none.
    """

    dedupe_window: float | None = None
    lookup_by: tuple[str, ...] = ()
    webhook_events: tuple[str, ...] = ()

    @property
    def resolvable(self) -> bool:
        """Whether an ambiguous send could ever be settled without an operator."""
        return bool(self.dedupe_window) or bool(self.lookup_by) or bool(self.webhook_events)


def profile_of(provider: object) -> ProviderProfile:
    """The provider's declared profile, or what its attributes say (a fake's, say)."""
    declared = getattr(provider, "profile", None)
    if isinstance(declared, ProviderProfile):
        return declared
    return ProviderProfile(
        dedupe_window=getattr(provider, "dedupe_window", None),
        lookup_by=("key_tag",) if isinstance(provider, Lookup) else (),
    )


@runtime_checkable
class Provider(Protocol):
    """An email provider adapter: one request in, exactly one outcome out."""

    name: str
    # How long the provider honours our idempotency key, in seconds; None when it does not.
    dedupe_window: float | None

    async def send(self, request: SendRequest) -> Outcome: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LookupResult:
    """What the provider said when asked for the message a step may have sent."""

    found: bool
    provider_message_id: str | None = None
    # The provider's answer, trimmed and free of secrets: kept as evidence either way.
    raw: dict[str, Any] = field(default_factory=dict)


class LookupFailed(Exception):
    """The provider could not be asked (network, 5xx, an unreadable answer): no answer at all."""


@runtime_checkable
class Lookup(Protocol):
    """An optional capability of a Provider: find a message by our idempotency key or
    Message-ID. The reconciler settles ``unknown`` rows of providers that have it.

    ``found=False`` is the provider's word that it has no such message; the reconciler
    keeps that as evidence but never takes it as proof the message was not sent.
    """

    async def lookup(self, idempotency_key: str, message_id: str) -> LookupResult: ...
