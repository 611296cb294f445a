"""Settings: every one an ``EVQ_*`` environment variable and a flag of ``evq worker run``.

The one loader of every option: :meth:`Settings.load` reads the environment and the flags,
every value parsed and validated, by the options ops/option_catalogue.py joins (the core's,
the adapters' and the interfaces' tables). ops/wiring.py builds each config from
:class:`Settings` (:meth:`Settings.worker_config`, :meth:`Settings.smtp_config`, ...).
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace
from datetime import time
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from email_validator import EmailNotValidError

from evq.adapters import null
from evq.adapters.http import config as http
from evq.adapters.http.config import HttpConfig
from evq.adapters.ses import config as ses
from evq.adapters.ses.config import SesConfig
from evq.adapters.smtp import config as smtp
from evq.adapters.smtp.config import JournalConfig, SmtpConfig
from evq.adapters.webhooks import config as webhooks
from evq.adapters.webhooks.config import WebhookConfig
from evq.ops.option_catalogue import ADAPTERS, ALL_OPTIONS, DERIVED, MCP_TOOLS, OPTION_BY_NAME, OPTIONS
from evq.ops.time_zones import time_zone
from evq.worker.addresses import validate_address
from evq.worker.approval_policy import ApprovalPolicy, policy_from
from evq.worker.circuit import FAULTS
from evq.worker.config import WorkerConfig
from evq.worker.notices import NoticeConfig, reserved_sender
from evq.worker.options import bad, bound_text, parse
from evq.worker.ports.providers import ProviderProfile
from evq.worker.ratelimit import RateLimit
from evq.worker.request import DECISION_FIELDS, Policy

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    C = TypeVar("C", bound=DataclassInstance)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every option, one field each (the interfaces read theirs here); the core and each
    adapter get their own config from it (:meth:`worker_config`, :meth:`smtp_config`, ...)."""

    database_url: str | None = None
    data_dir: str | None = None
    adapter: tuple[str, ...] = ("smtp",)
    concurrency: int = 10
    batch_size: int = 100
    lease_seconds: float = 120.0
    max_attempts: int = 1000
    poll_interval: float = 1.0
    retry_base: float = 5.0
    retry_max: float = 900.0
    retry_for: float = 432000.0
    circuit_faults: frozenset[str] = frozenset(FAULTS)
    circuit_failures: int = 10
    circuit_probe_base: float = 10.0
    circuit_probe_max: float = 600.0
    listen: str = "auto"
    pooler: str = "auto"
    startup_wait: float = 60.0
    rate_limit: tuple[RateLimit, ...] = ()
    rescue_interval: float = 15.0
    shutdown_grace: float = 30.0
    allowed_domains: tuple[str, ...] = ()
    blocked_domains: tuple[str, ...] = ()
    internal_domains: tuple[str, ...] = ()
    max_message_bytes: int = 1024 * 1024
    max_recipients: int = 50
    max_input_bytes: int = 64 * 1024 * 1024
    default_from: str | None = None
    require_provenance: tuple[str, ...] = ()
    refuse_unresolvable: bool = False
    approval_always: bool = False
    approval_first_contact: str = "off"
    approval_max_recipients: int | None = None
    approval_hours: tuple[time, time] | None = None
    approval_weekdays: tuple[int, ...] | None = None
    approval_timezone: str = "UTC"
    approval_expires: float | None = 3 * 86400.0
    budget_run_recipients: int | None = None
    budget_key_hourly: int | None = None
    budget_key_daily: int | None = None
    budget_domain_hourly: int | None = None
    budget_action: str = "hold"
    smtp_host: str = "localhost"
    smtp_port: int = 25
    smtp_username: str | None = None
    smtp_password: str | None = None
    smtp_tls: str = "none"
    smtp_timeout: float = 30.0
    smtp_helo_name: str | None = None
    smtp_ca_file: str | None = None
    smtp_client_cert: str | None = None
    smtp_client_key: str | None = None
    smtp_allow_plain_auth: bool = False
    smtp_journal: str | None = None
    journal_imap_url: str | None = None
    journal_imap_password: str | None = None
    journal_imap_ca_file: str | None = None
    journal_imap_timeout: float = 10.0
    smtp_relay: str = "none"
    http_base_url: str = "https://api.resend.com"
    http_api_key: str | None = None
    http_timeout: float = 10.0
    http_dedupe_window: float = 86400.0
    http_callback_timeout: float = 5.0
    http_callback_allow_private: bool = False
    ses_region: str | None = None
    ses_endpoint_url: str | None = None
    ses_configuration_set: str | None = None
    ses_timeout: float = 10.0
    ses_access_key_id: str | None = None
    ses_secret_access_key: str | None = None
    notice_from: str | None = None
    notice_on_unknown: bool = False
    reconcile_interval: float = 30.0
    reconcile_rate: float = 2.0
    reconcile_checks: int = 5
    keep_content: float | None = 30 * 86400.0
    evidence_partition_steps: int = 1_000_000
    null_delay: float = 0.0
    log_format: str = "auto"
    log_level: str = "info"
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    metrics_queue: str = "on"
    serve_host: str = "127.0.0.1"
    serve_port: int = 8080
    serve_secret: str | None = None
    serve_max_body: int = 4 * 1024 * 1024
    serve_auth_failures: int = 10
    serve_auth_window: float = 60.0
    serve_header_timeout: float = 10.0
    serve_body_timeout: float = 30.0
    serve_max_connections: int = 512
    ops_timezone: str = "UTC"
    # The delivery webhooks' EVQ_WEBHOOK_* (adapters/webhooks/config.py).
    webhook_max_body: int = 1024 * 1024
    webhook_tolerance: float = 300.0
    webhook_resend_secret: str | None = None
    webhook_sendgrid_public_key: str | None = None
    webhook_postmark_user: str | None = None
    webhook_postmark_password: str | None = None
    webhook_postmark_token: str | None = None
    webhook_mailgun_signing_key: str | None = None
    webhook_ses_topic_arns: tuple[str, ...] = ()
    webhook_sns_cert_hosts: str = webhooks.SNS_HOSTS
    webhook_sns_ca_file: str | None = None
    webhook_sns_tolerance: float = 3600.0
    mcp_tools: tuple[str, ...] = ()
    mcp_resolve: bool = False
    mcp_approve: bool = False

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Environment first, then explicit overrides (flags); every value validated."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for option in OPTIONS:
            raw = env.get(option.env)
            if raw is not None and raw != "":
                values[option.name] = parse(option, raw, source=option.env)
        for name, value in overrides.items():
            if value is None:
                continue
            option = OPTION_BY_NAME[name]
            values[name] = parse(option, value, source=option.flag) if isinstance(value, str) else value
        settings = cls(**values)
        # The constants that follow a setting, unless a caller passed one.
        derived = {name: rule(settings) for name, (_, rule) in DERIVED.items() if name not in values}
        settings = replace(settings, **derived)
        settings.validate()
        return settings

    def validate(self) -> None:
        for option in ALL_OPTIONS:
            value = getattr(self, option.name)
            if isinstance(value, float) and not math.isfinite(value):
                # float() reads "nan", "inf" and "1e999"; NaN passes every minimum (all its
                # comparisons are false). Either would be a lease, a timeout or a window that
                # no clock, socket or PostgreSQL interval can hold.
                raise bad(option, f"must be a finite number, got {value}")
            if option.minimum is not None and value is not None and value < option.minimum:
                raise bad(option, f"must be at least {bound_text(option.minimum)}, got {value}")
            if option.maximum is not None and value is not None and value > option.maximum:
                raise bad(option, f"must be at most {bound_text(option.maximum)}, got {value}")
            if option.choices and value not in option.choices:
                raise bad(option, f"must be one of {', '.join(option.choices)}, got {value!r}")
        try:
            time_zone(self.ops_timezone)  # an override not read from text is checked here too
        except ValueError as exc:
            raise bad(OPTION_BY_NAME["ops_timezone"], str(exc)) from None
        for name in self.adapter:
            if name not in ADAPTERS:
                raise bad(OPTION_BY_NAME["adapter"], f"unknown adapter {name!r}; known: {', '.join(ADAPTERS)}")
        if not self.adapter:
            raise bad(OPTION_BY_NAME["adapter"], "name at least one adapter")
        if "smtp" in self.adapter and self.lease_seconds <= self.smtp_timeout * 3:
            # One SMTP send is several network operations, each bounded by smtp_timeout;
            # a lease shorter than that would let the rescuer act on a send still talking.
            raise bad(
                OPTION_BY_NAME["lease_seconds"],
                f"must exceed 3 x EVQ_SMTP_TIMEOUT ({self.smtp_timeout * 3:g}s) so a live send is never rescued",
            )
        if self.pooler == "transaction" and self.listen == "on":
            raise bad(
                OPTION_BY_NAME["listen"], "cannot be on behind a transaction-mode pooler (notifications never arrive)"
            )
        if "smtp" in self.adapter:
            self.smtp_config().validate()
            self.journal_config().validate()
            if self.journal_imap_url and self.journal_imap_timeout * 2 >= self.lease_seconds:
                # The reconciler gives one lookup half of its hold (about a lease): the
                # lookup's own limit must come first, so its failure is the one reported.
                raise bad(
                    OPTION_BY_NAME["journal_imap_timeout"],
                    f"must be under half of EVQ_LEASE_SECONDS ({self.lease_seconds / 2:g}s)",
                )
        for limit in self.rate_limit:
            if limit.provider not in ADAPTERS:
                raise bad(
                    OPTION_BY_NAME["rate_limit"],
                    f"names an unknown provider {limit.provider!r}; known: {', '.join(ADAPTERS)}",
                )
        self.worker_config().validate()
        if self.serve_port > 65535:
            raise bad(OPTION_BY_NAME["serve_port"], f"must be a TCP port (at most 65535), got {self.serve_port}")
        if self.metrics_port is not None and self.metrics_port > 65535:
            raise bad(OPTION_BY_NAME["metrics_port"], f"must be a TCP port (at most 65535), got {self.metrics_port}")
        if "http" in self.adapter:
            self.http_config().validate()
            if self.lease_seconds <= self.http_timeout * 3:
                # Connect, send and answer are each bounded by http_timeout.
                raise bad(
                    OPTION_BY_NAME["lease_seconds"],
                    f"must exceed 3 x EVQ_HTTP_TIMEOUT ({self.http_timeout * 3:g}s) so a live send is never rescued",
                )
        if "ses" in self.adapter:
            self.ses_config().validate()
            if self.lease_seconds <= self.ses_timeout * 3:
                # Connect, send and answer are each bounded by ses_timeout.
                raise bad(
                    OPTION_BY_NAME["lease_seconds"],
                    f"must exceed 3 x EVQ_SES_TIMEOUT ({self.ses_timeout * 3:g}s) so a live send is never rescued",
                )
        for tool in self.mcp_tools:
            if tool not in MCP_TOOLS:
                raise bad(OPTION_BY_NAME["mcp_tools"], f"unknown tool {tool!r}; known: {', '.join(MCP_TOOLS)}")
        unknown = [name for name in self.require_provenance if name not in DECISION_FIELDS]
        if unknown:
            raise bad(
                OPTION_BY_NAME["require_provenance"],
                f"names no decision field: {', '.join(unknown)}; known: {', '.join(DECISION_FIELDS)}",
            )
        self.webhook_config().validate()
        if self.notice_from is not None:
            try:
                validate_address(self.notice_from, self.internal_domains)
            except EmailNotValidError as exc:
                raise bad(OPTION_BY_NAME["notice_from"], f"is not a valid address: {exc}") from None

    def worker_config(self) -> WorkerConfig:
        """The core's config (worker/config.py)."""
        return _section(WorkerConfig, self)

    def smtp_config(self) -> SmtpConfig:
        return _section(SmtpConfig, self, "smtp_")

    def journal_config(self) -> JournalConfig:
        return _section(JournalConfig, self, "journal_imap_")

    def http_config(self) -> HttpConfig:
        return _section(HttpConfig, self, "http_")

    def ses_config(self) -> SesConfig:
        return _section(SesConfig, self, "ses_")

    def webhook_config(self) -> WebhookConfig:
        return _section(WebhookConfig, self, "webhook_")

    def webhooks_configured(self) -> frozenset[str]:
        """The webhook providers (resend, sendgrid, postmark, mailgun, ses) whose events `evq serve`
        can verify: those whose secret, key or topic setting (EVQ_WEBHOOK_*, adapters/webhooks/config.py)
        is set. An event only settles a lost answer once its webhook is verified; none set: none
        counts in a provider's profile (:meth:`provider_profiles`)."""
        return frozenset(self.webhook_config().configured())

    def provider_profiles(self, webhooks_configured: Collection[str] | None = None) -> dict[str, ProviderProfile]:
        """Every provider's profile (docs/design.md, "Provider profiles") from the settings alone,
        no connection opened: what the enqueue side (`evq serve`, the CLI, `evq mcp`) knows. Each
        adapter says its own from its config; ``webhooks_configured`` defaults to
        :meth:`webhooks_configured`."""
        hooks = self.webhooks_configured() if webhooks_configured is None else frozenset(webhooks_configured)
        return {
            "smtp": smtp.profile(self.smtp_config(), hooks, witness=self.journal_config().url is not None),
            "http": http.profile(self.http_config(), hooks),
            "ses": ses.profile(self.ses_config(), hooks),
            "null": null.profile(),
        }

    def webhook_step_providers(self) -> dict[str, frozenset[str]]:
        """For each webhook provider (resend, sendgrid, postmark, mailgun, ses), the step providers
        whose messages its events can be about, from each adapter's ``reported_by``: ``resend``
        the http adapter, ``ses`` the ses adapter (and smtp when EVQ_SMTP_RELAY=ses), a relay's
        webhook smtp when EVQ_SMTP_RELAY names it. An event may match only a step of these
        (delivery_record's ``step_providers``): another provider's step is never its to close."""
        reported = {
            "smtp": smtp.reported_by(self.smtp_config()),
            "http": http.reported_by(self.http_config()),
            "ses": ses.reported_by(self.ses_config()),
        }
        return {
            hook: frozenset(step for step, hooks in reported.items() if hook in hooks) for hook in webhooks.PROVIDERS
        }

    def policy(self) -> Policy:
        profiles = self.provider_profiles()
        return Policy(
            max_message_bytes=self.max_message_bytes,
            max_recipients=self.max_recipients,
            allowed_domains=self.allowed_domains,
            blocked_domains=self.blocked_domains,
            default_from=self.default_from,
            default_provider=self.adapter[0],
            providers=tuple(ADAPTERS),
            reserved_senders=(reserved_sender(self.notice_from),),
            internal_domains=self.internal_domains,
            require_provenance=self.require_provenance,
            unresolvable=tuple(name for name, p in profiles.items() if not p.resolvable),
            refuse_unresolvable=self.refuse_unresolvable,
            approval=self.approval_policy(),
        )

    def approval_policy(self) -> ApprovalPolicy:
        return policy_from(
            always=self.approval_always,
            first_contact=self.approval_first_contact,
            max_recipients=self.approval_max_recipients,
            hours=self.approval_hours,
            weekdays=self.approval_weekdays,
            timezone=self.approval_timezone,
            expires=self.approval_expires,
            run_recipients=self.budget_run_recipients,
            key_hourly=self.budget_key_hourly,
            key_daily=self.budget_key_daily,
            domain_hourly=self.budget_domain_hourly,
            over_budget=self.budget_action,
        )

    def notices(self) -> NoticeConfig:
        return NoticeConfig(
            sender=self.notice_from, on_unknown=self.notice_on_unknown, internal_domains=self.internal_domains
        )

    def secrets(self) -> list[str]:
        """Values that must never appear in a log line, an evidence row or an error."""
        out = [getattr(self, o.name) for o in ALL_OPTIONS if o.secret and getattr(self, o.name)]
        if self.database_url:
            try:
                password = urlsplit(self.database_url).password
            except ValueError:
                password = None
            if password:
                out.append(password)
        # A base URL may carry basic-auth credentials (http://user:password@host).
        out += http.url_secrets(self.http_base_url)
        return out

    def as_public_dict(self) -> dict[str, Any]:
        return {
            f.name: ("***" if OPTION_BY_NAME[f.name].secret and getattr(self, f.name) else getattr(self, f.name))
            for f in fields(self)
        }


def _section(config: type[C], settings: Settings, prefix: str = "") -> C:
    """``config`` filled from the settings named ``prefix`` + each of its fields."""
    return config(**{f.name: getattr(settings, prefix + f.name) for f in fields(config)})
