"""The HTTP adapter's ``EVQ_HTTP_*`` options and the config built from them.

The one loader (ops/settings.py) reads these with every other option; ops/wiring.py
builds :class:`HttpConfig` from it and the provider from that. Importing this module
costs nothing of the adapter itself (no httpx), so every `evq` command can.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from evq.worker.delivery import DeliveryType
from evq.worker.options import Option, bad
from evq.worker.ports.providers import ProviderProfile

OPTIONS: tuple[Option, ...] = (
    Option(
        "http_base_url",
        str,
        "https://api.resend.com",
        "Base URL of the Resend-style HTTP email API (POST {base}/emails).",
    ),
    Option(
        "http_api_key",
        str,
        None,
        "Bearer API key of the HTTP email API (required with EVQ_ADAPTER=http; never logged).",
        secret=True,
    ),
    Option(
        "http_timeout", float, 10.0, "Seconds for each HTTP network operation (connect, send, answer).", minimum=0.1
    ),
    Option(
        "http_dedupe_window",
        float,
        86400.0,
        "Seconds the HTTP provider honours our Idempotency-Key, counted from the first attempt (0: it does not).",
        minimum=0,
    ),
    Option(
        "http_callback_timeout",
        float,
        5.0,
        "Seconds for each POST of a signed callback to an API key's notify URL (connect to answer).",
        minimum=0.1,
    ),
    Option(
        "http_callback_allow_private",
        bool,
        False,
        "Let callbacks reach loopback, private and link-local addresses (off: refused, so a key's URL cannot "
        "reach evq's own network).",
    ),
)

_OPTION = {o.name: o for o in OPTIONS}


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """The EVQ_HTTP_* options without their prefix (a unit test compares them)."""

    base_url: str = "https://api.resend.com"
    api_key: str | None = None
    timeout: float = 10.0
    dedupe_window: float = 86400.0
    callback_timeout: float = 5.0
    callback_allow_private: bool = False

    def validate(self) -> None:
        """The checks of a worker that sends through this adapter."""
        if not self.api_key:
            raise bad(_OPTION["http_api_key"], "is required with EVQ_ADAPTER=http")
        if urlsplit(self.base_url).scheme not in ("http", "https"):
            raise bad(_OPTION["http_base_url"], f"must be an http(s) URL, got {shown_url(self.base_url)!r}")


def shown_url(url: str) -> str:
    """``url`` as a message or a log line may name it: a user and password in it (an API
    behind basic auth) are credentials, so the userinfo becomes ``***`` (``http://***@host``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"  # fail closed: the raw text may hold the password
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def url_secrets(url: str | None) -> list[str]:
    """The userinfo of ``url``, raw and as parsed, for worker/logs.py's scrubber."""
    if not url:
        return []
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    userinfo = parts.netloc.rpartition("@")[0]
    return [v for v in {userinfo, parts.password, userinfo.partition(":")[2]} if v]


# The webhook (adapters/webhooks/, POST /v1/webhooks/resend) of the API this adapter speaks,
# and the delivery types (worker/delivery.py) its events become: email.delivered,
# email.delivery_delayed, email.bounced (permanent or transient), email.complained,
# email.opened, email.clicked.
WEBHOOK: Final = "resend"
WEBHOOK_EVENTS: Final[tuple[DeliveryType, ...]] = (
    "delivered",
    "deferred",
    "bounced_hard",
    "bounced_soft",
    "complained",
    "opened",
    "clicked",
)


def profile(config: HttpConfig, webhooks: Collection[str] = ()) -> ProviderProfile:
    """What this provider can do to settle a lost answer (docs/design.md, "Provider profiles"),
    from the settings alone: it honours our key for EVQ_HTTP_DEDUPE_WINDOW (0: not at all), its
    messages are found by the ``evq_key`` tag, and it reports deliveries by webhook when
    ``webhooks`` (the webhook providers whose secret is set) names :data:`WEBHOOK`."""
    return ProviderProfile(
        dedupe_window=config.dedupe_window or None,
        lookup_by=("key_tag",),
        webhook_events=WEBHOOK_EVENTS if set(reported_by(config)) & set(webhooks) else (),
    )


def reported_by(config: HttpConfig) -> tuple[str, ...]:
    """The webhook providers whose events can be about a message this adapter sent (Resend-style)."""
    return (WEBHOOK,)
