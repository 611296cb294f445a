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
