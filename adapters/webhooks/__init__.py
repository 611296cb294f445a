"""Provider delivery webhooks: one module per provider, each a verifier and a parser,
``verify_and_parse(headers, body, config, now, query) -> list[DeliveryEvent]`` raising
:class:`~evq.worker.ports.webhooks.WebhookRefused`.

- :mod:`.resend`: Svix signatures (the ``svix`` library);
- :mod:`.sendgrid`: the Signed Event Webhook, ECDSA P-256 (``cryptography``);
- :mod:`.postmark`: basic auth or a token in the URL, compared in constant time;
- :mod:`.mailgun`: HMAC-SHA256 of timestamp and token, in the body;
- :mod:`.ses`: SES events through SNS, SNS message signatures v1/v2.

:func:`receivers` gives the configured ones as the port's ``Receiver`` callables
(worker/ports/webhooks.py); ops/wiring.py hands them to `evq serve`'s route.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import partial

from evq.adapters.webhooks.config import PROVIDERS, WebhookConfig
from evq.worker.delivery import DeliveryEvent
from evq.worker.ports.webhooks import Receiver

__all__ = ["PROVIDERS", "WebhookConfig", "libraries", "receivers"]

# The libraries each provider's check imports when an event arrives (the `webhooks` extra).
LIBRARIES = {
    "resend": ("svix.webhooks",),
    "sendgrid": ("cryptography.hazmat.primitives.asymmetric.ec",),
    "ses": ("cryptography.x509", "httpx"),
}


def libraries(config: WebhookConfig) -> None:
    """Import what the configured providers' checks need, so a missing one is said at start-up
    (ModuleNotFoundError), not as a 500 on the provider's first event."""
    import importlib

    for name in config.configured():
        for module in LIBRARIES.get(name, ()):
            importlib.import_module(module)


def _call(
    module_verify: object,
    config: WebhookConfig,
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    now: datetime,
) -> list[DeliveryEvent]:
    return module_verify(headers, body, config, now, query)  # type: ignore[operator,no-any-return]


def _mailgun(
    config: WebhookConfig,
    seen: object,
    headers: Mapping[str, str],
    body: bytes,
    query: Mapping[str, str],
    now: datetime,
) -> list[DeliveryEvent]:
    from evq.adapters.webhooks import mailgun

    return mailgun.verify_and_parse(headers, body, config, now, query, seen)  # type: ignore[arg-type]


def receivers(config: WebhookConfig) -> dict[str, Receiver]:
    """A receiver for each provider the settings configure; the others have none (404)."""
    from evq.adapters.webhooks import mailgun, postmark, resend, sendgrid
    from evq.adapters.webhooks.ses import SnsReceiver

    out: dict[str, Receiver] = {}
    for name in config.configured():
        if name == "ses":
            out[name] = SnsReceiver(config)
        elif name == "mailgun":
            out[name] = partial(_mailgun, config, mailgun.SeenTokens())
        else:
            module = {"resend": resend, "sendgrid": sendgrid, "postmark": postmark}[name]
            out[name] = partial(_call, module.verify_and_parse, config)
    return out
