"""A provider's delivery webhook, verified and read (adapters/webhooks/, one module per provider).

A receiver is a plain callable, ``receiver(headers, body, query, now) -> list[DeliveryEvent]``:
the request's headers (names lower-cased), its whole body, its query parameters and the time
it arrived. It verifies the request the provider's documented way and translates what it says
into :class:`~evq.worker.delivery.DeliveryEvent`; anything it cannot verify or read is a
:class:`WebhookRefused`, which the HTTP route (ops/web/webhooks.py) answers with a 4xx and
counts, and which never reaches the store. A receiver may block (the SNS one fetches a
certificate); the route calls it off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final, TypeAlias

from evq.worker.delivery import DeliveryEvent

# Why a webhook was refused: the label values of evq_webhook_refused_total (worker/metrics.py).
REFUSAL_REASONS: Final = (
    "unknown_provider",  # no such provider
    "not_configured",  # the provider has no settings, so nothing can be verified
    "unsigned",  # no signature (or no credentials) at all
    "bad_signature",  # a signature (or credentials) that does not verify
    "replayed",  # a timestamp outside the tolerance, or a token seen before
    "too_large",  # a body over EVQ_WEBHOOK_MAX_BODY
    "malformed",  # signed, but not the provider's documented shape
    "wrong_topic",  # SNS: a topic not in EVQ_WEBHOOK_SES_TOPIC_ARNS
    "foreign_cert",  # SNS: a certificate (or subscribe) URL not on an SNS host
    "cert_unavailable",  # SNS: the signing certificate could not be fetched (503: the provider retries)
    "subscribe_failed",  # SNS: the subscription could not be confirmed (503: SNS asks again)
    "throttled",  # 429: this address sent too many unsigned or badly signed requests lately
)


class WebhookRefused(Exception):
    """A webhook request evq will not believe: ``status`` (a 4xx; 503 when evq could not check
    it now, so the provider retries) and ``reason`` (a word of
    :data:`REFUSAL_REASONS`), with a short message built from evq's own words only, never
    the peer's bytes or a secret."""

    def __init__(self, status: int, reason: str, message: str = ""):
        if reason not in REFUSAL_REASONS:
            raise ValueError(f"unknown refusal reason {reason!r}")
        super().__init__(f"{reason}: {message}" if message else reason)
        self.status = status
        self.reason = reason
        self.message = message or reason


Receiver: TypeAlias = Callable[[Mapping[str, str], bytes, Mapping[str, str], datetime], list[DeliveryEvent]]
