"""The SES adapter's ``EVQ_SES_*`` options and the config built from them.

The one loader (ops/settings.py) reads these with every other option; ops/wiring.py
builds :class:`SesConfig` from it and the provider from that. Importing this module
costs nothing of the adapter itself (no boto3), so every `evq` command can.

Unset region, endpoint and keys fall back to the standard AWS chain (``AWS_REGION``,
``AWS_ACCESS_KEY_ID``, a profile, the instance's role), as every AWS tool does.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import urlsplit

from evq.worker.delivery import DELIVERY_TYPES
from evq.worker.options import Option, bad
from evq.worker.ports.providers import ProviderProfile

OPTIONS: tuple[Option, ...] = (
    Option(
        "ses_region",
        str,
        None,
        "AWS region of Amazon SES (e.g. eu-west-1). Unset: the AWS chain (AWS_REGION, AWS_DEFAULT_REGION, the profile).",
    ),
    Option(
        "ses_endpoint_url",
        str,
        None,
        "SES API endpoint URL (unset: the region's; set for a VPC endpoint or an emulator such as moto).",
    ),
    Option(
        "ses_configuration_set",
        str,
        None,
        "SES configuration set every send names: its event destination publishes delivery events to SNS.",
    ),
    Option("ses_timeout", float, 10.0, "Seconds for each SES network operation (connect, send, answer).", minimum=0.1),
    Option(
        "ses_access_key_id",
        str,
        None,
        "AWS access key id for SES, with EVQ_SES_SECRET_ACCESS_KEY (unset: the AWS chain; never logged).",
        secret=True,
    ),
    Option(
        "ses_secret_access_key",
        str,
        None,
        "AWS secret access key of EVQ_SES_ACCESS_KEY_ID (never logged).",
        secret=True,
    ),
)

_OPTION = {o.name: o for o in OPTIONS}


@dataclass(frozen=True, slots=True)
class SesConfig:
    """The EVQ_SES_* options without their prefix (a unit test compares them)."""

    region: str | None = None
    endpoint_url: str | None = None
    configuration_set: str | None = None
    timeout: float = 10.0
    access_key_id: str | None = None
    secret_access_key: str | None = None

    def validate(self) -> None:
        """The checks of a worker that sends through this adapter."""
        if bool(self.access_key_id) != bool(self.secret_access_key):
            raise bad(_OPTION["ses_access_key_id"], "and EVQ_SES_SECRET_ACCESS_KEY go together: set both or neither")
        if self.endpoint_url is not None and urlsplit(self.endpoint_url).scheme not in ("http", "https"):
            raise bad(_OPTION["ses_endpoint_url"], f"must be an http(s) URL, got {self.endpoint_url!r}")


def profile(config: SesConfig, webhooks: Collection[str] = ()) -> ProviderProfile:
    """What SES can do to settle a lost answer (docs/design.md, "Provider profiles"): it honours
    no key and cannot be asked by our values, so only its events (through SNS) can, and only when
    `evq serve` verifies them (``webhooks`` names ``ses``: EVQ_WEBHOOK_SES_TOPIC_ARNS) and a
    configuration set publishes them (EVQ_SES_CONFIGURATION_SET)."""
    events = DELIVERY_TYPES if set(reported_by(config)) & set(webhooks) and config.configuration_set else ()
    return ProviderProfile(dedupe_window=None, lookup_by=(), webhook_events=events)


def reported_by(config: SesConfig) -> tuple[str, ...]:
    """The webhook providers whose events can be about a message this adapter sent: SES's, through SNS."""
    return ("ses",)
