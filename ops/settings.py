"""Settings: every one an ``EVQ_*`` environment variable and a flag of ``evq worker run``.

The one loader of every option. Each config declares its own table where it is used
(the core's in worker/config.py, the SMTP adapter's in adapters/smtp/config.py, the
HTTP adapter's in adapters/http/config.py, the SES adapter's in adapters/ses/config.py,
the null adapter's in adapters/null.py);
the database, logging, /metrics, `evq serve` and `evq mcp` options, which only the
interfaces and the composition root read, are here. :data:`OPTIONS` joins them and
is the single source for the flags, the environment names, the defaults, the
README's settings table (a test compares them) and the validation messages, so none
of them can drift from the others. ops/wiring.py builds each config from
:class:`Settings` (:meth:`Settings.worker_config`, :meth:`Settings.smtp_config`, ...).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields, replace
from datetime import time
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

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
from evq.worker.addresses import validate_address
from evq.worker.approval_policy import ApprovalPolicy, approval_options, policy_from
from evq.worker.circuit import FAULTS
from evq.worker.config import (
    NOTICE_OPTIONS,
    PACE_OPTIONS,
    POLICY_OPTIONS,
    RECONCILE_OPTIONS,
    RETENTION_OPTIONS,
    WORKER_OPTIONS,
    WorkerConfig,
)
from evq.worker.notices import NoticeConfig, reserved_sender
from evq.worker.options import Option, bad, boolean, bound_text, duration, lowercase_list, parse
from evq.worker.ports.providers import ProviderProfile
from evq.worker.ratelimit import RateLimit
from evq.worker.request import DECISION_FIELDS, Policy

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    C = TypeVar("C", bound=DataclassInstance)

DATABASE_OPTIONS: tuple[Option, ...] = (
    Option(
        "database_url",
        str,
        None,
        "PostgreSQL URL, or `embedded`: a PostgreSQL of evq's own in the user data folder (the `embedded` extra). "
        "Unset: every command but `evq admin demo` refuses to start and says how to set it.",
        secret=True,
    ),
    Option(
        "data_dir",
        str,
        None,
        "Folder for the embedded PostgreSQL (default: the user data dir, e.g. ~/.local/share/evq).",
    ),
)

ADAPTER_OPTIONS: tuple[Option, ...] = (
    Option(
        "adapter",
        lowercase_list,
        ("smtp",),
        "Provider adapter(s) this worker sends through, comma-separated: smtp, http, ses, null.",
    ),
)

# How evq reaches PostgreSQL (adapters/postgres/listen.py, pooler.py).
CONNECTION_OPTIONS: tuple[Option, ...] = (
    Option(
        "listen",
        str,
        "auto",
        "Wake on LISTEN/NOTIFY: auto (fall back to polling), on, off.",
        choices=("auto", "on", "off"),
    ),
    Option(
        "pooler",
        str,
        "auto",
        "A pooler between evq and PostgreSQL: auto (probe at start; when a pooler answers, behave as "
        "transaction, with a warning), none (no probe), or transaction (PgBouncer in transaction mode: "
        "no prepared statements, no LISTEN; polling instead).",
        choices=("auto", "none", "transaction"),
    ),
    Option(
        "startup_wait",
        duration,
        60.0,
        "Seconds a starting worker or `evq serve` waits for a database that does not answer (down, starting, "
        "shutting down), retrying with a logged backoff, before it exits 9 (E_DB_UNAVAILABLE); 0: fail at once.",
        minimum=0,
    ),
)

LOG_OPTIONS: tuple[Option, ...] = (
    Option(
        "log_format",
        str,
        "auto",
        "Log format: auto (console on a terminal, else JSON), json, console.",
        choices=("auto", "json", "console"),
    ),
    Option(
        "log_level",
        str,
        "info",
        "Log level: debug, info, warning, error.",
        choices=("debug", "info", "warning", "error"),
    ),
)

METRICS_OPTIONS: tuple[Option, ...] = (
    Option(
        "metrics_port",
        int,
        None,
        "Serve /metrics and /healthz on this port (unset: off; 9640 is evq's usual port; 0: any free port).",
        minimum=0,
    ),
    Option(
        "metrics_host",
        str,
        "127.0.0.1",
        "Address /metrics listens on (0.0.0.0 lets a Prometheus on another host scrape it).",
    ),
    Option(
        "metrics_queue",
        str,
        "on",
        "Also export the queue gauges read from the database at scrape time: on, off.",
        choices=("on", "off"),
    ),
)


def time_zone(name: str) -> str:
    """An IANA time zone name the system knows (``Europe/Berlin``, ``UTC``), as given; an
    unknown or malformed one (``Mars/Olympus``, ``../etc``) is refused with ValueError."""
    text = name.strip()
    try:
        ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ZoneInfo reads a file named by the key: refuse anything that is not a known zone.
        raise ValueError(f"unknown time zone {text[:80]!r} (an IANA name such as UTC or Europe/Berlin)") from None
    if text not in zone_names():
        # ZoneInfo also opens right/ (leap-second clocks), posix/ copies and files such as
        # posixrules, localtime or Factory that are no zone an operator means.
        raise ValueError(f"{text[:80]!r} is not an IANA zone name (such as UTC or Europe/Berlin)")
    return text


# Files in the zone database that ZoneInfo opens but that name no zone a person lives in.
NOT_ZONES = frozenset({"posixrules", "localtime", "Factory"})


@functools.cache
def zone_names() -> frozenset[str]:
    """The IANA zone names an operator may choose: the system's, less right/ and posix/ copies
    and the special files (NOT_ZONES)."""
    return frozenset(z for z in available_timezones() if not z.startswith(("right/", "posix/")) and z not in NOT_ZONES)


SERVE_OPTIONS: tuple[Option, ...] = (
    Option("serve_host", str, "127.0.0.1", "Address `evq serve` (HTTP API, ops page, /metrics) listens on."),
    Option("serve_port", int, 8080, "Port `evq serve` listens on (0: any free port).", minimum=0),
    Option(
        "serve_secret",
        str,
        None,
        "Secret that signs ops-page session cookies (unset: a new one per process, so sessions end at a restart; set it when several `evq serve` share users).",
        secret=True,
    ),
    Option(
        "serve_max_body",
        int,
        4 * 1024 * 1024,
        "Largest HTTP request body `evq serve` reads, in bytes (413 beyond).",
        minimum=1024,
    ),
    Option(
        "serve_auth_failures",
        int,
        10,
        "Wrong or revoked API keys one client address may present within EVQ_SERVE_AUTH_WINDOW before `evq serve` answers its key checks 429 (Retry-After) without looking.",
        minimum=1,
    ),
    Option(
        "serve_auth_window",
        float,
        60.0,
        "Seconds over which `evq serve` counts a client address's failed key checks (and the longest it refuses that address).",
        minimum=1,
    ),
    Option(
        "serve_header_timeout",
        float,
        10.0,
        "Seconds a client of `evq serve` has to send a request's line and headers, counted from its first byte (or the connection); then 408 and closed.",
        minimum=0.1,
    ),
    Option(
        "serve_body_timeout",
        float,
        30.0,
        "Seconds a client of `evq serve` has to send a request's whole body once its headers are in (then 408 and closed), and to take in more of an answer it stopped reading (then closed).",
        minimum=0.1,
    ),
    Option(
        "serve_max_connections",
        int,
        512,
        "Most connections `evq serve` holds open; beyond it the one waiting longest on its client is closed (keep it under the open-file limit, ulimit -n).",
        minimum=2,
    ),
    Option(
        "ops_timezone",
        time_zone,
        "UTC",
        "IANA time zone the ops page shows exact times in (each `<time>`'s title), e.g. Europe/Berlin; a signed-in operator may choose another for their session.",
    ),
)

# Which sends wait for a person, and the blast-radius budgets (worker/approval_policy.py).
APPROVAL_OPTIONS: tuple[Option, ...] = approval_options()

MCP_OPTIONS: tuple[Option, ...] = (
    Option(
        "mcp_tools",
        lowercase_list,
        (),
        "Tools `evq mcp` offers beyond an agent's, comma-separated: resolve (evq_steps_resolve, which dry-runs "
        "unless told dry_run: false), approve (evq_steps_approve and evq_steps_deny, which need an operator or "
        "admin key). Empty: an agent's MCP server holds no tool that could approve the agent's own sends.",
    ),
    Option(
        "mcp_resolve",
        boolean,
        False,
        "Offer the evq_steps_resolve tool on `evq mcp` (it dry-runs unless told dry_run: false).",
    ),
    Option(
        "mcp_approve",
        boolean,
        False,
        "Offer evq_steps_approve and evq_steps_deny on `evq mcp` (they need an operator or admin key). Off: "
        "an agent's MCP server holds no tool that could approve the agent's own sends.",
    ),
)

# In the order `evq worker run --help` and README's table have always listed them: the
# core's tables are interleaved with the others where that order interleaved them.
_ALL: tuple[Option, ...] = (
    *DATABASE_OPTIONS,
    *ADAPTER_OPTIONS,
    *WORKER_OPTIONS,
    *CONNECTION_OPTIONS,
    *PACE_OPTIONS,
    *POLICY_OPTIONS,
    *APPROVAL_OPTIONS,
    *smtp.OPTIONS,
    *smtp.JOURNAL_OPTIONS,
    *http.OPTIONS,
    *ses.OPTIONS,
    *NOTICE_OPTIONS,
    *RECONCILE_OPTIONS,
    *RETENTION_OPTIONS,
    *null.OPTIONS,
    *LOG_OPTIONS,
    *METRICS_OPTIONS,
    *SERVE_OPTIONS,
    *webhooks.OPTIONS,
    *MCP_OPTIONS,
)

# Documented constants: options every config still has (a Python caller may pass them to
# Settings), but no EVQ_* variable or flag sets, because nobody running evq needs to turn them
# (docs/settings.md lists each with its value). Each is fixed, or follows a setting (DERIVED).
CONSTANTS: frozenset[str] = frozenset(
    {
        # The worker's inner workings.
        "batch_size",
        "max_attempts",
        "circuit_faults",
        "circuit_failures",
        "listen",
        "startup_wait",
        "max_input_bytes",
        "reconcile_interval",
        "reconcile_rate",
        "null_delay",
        "max_recipients",
        "max_message_bytes",
        # `evq admin serve --port` says where it listens (8080 by default).
        "serve_port",
        # `evq serve`'s protection against slow, large and guessing clients.
        "serve_max_body",
        "serve_auth_failures",
        "serve_auth_window",
        "serve_header_timeout",
        "serve_body_timeout",
        "serve_max_connections",
        # Provider webhooks: sizes, clock skew and the SNS certificate hosts are the providers' facts.
        "webhook_max_body",
        "webhook_tolerance",
        "webhook_sns_cert_hosts",
        "webhook_sns_ca_file",
        "webhook_sns_tolerance",
        # Bounded by other settings or by the protocol.
        "journal_imap_timeout",
        "http_callback_timeout",
        # A client certificate for an SMTP server that demands one (rare): a Python caller's.
        "smtp_client_cert",
        "smtp_client_key",
        # Amazon SES: the AWS SDK's own chain (AWS_REGION, AWS_ENDPOINT_URL_SES,
        # AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or a role) says where and who.
        "ses_region",
        "ses_endpoint_url",
        "ses_access_key_id",
        "ses_secret_access_key",
        # The embedded PostgreSQL lives in the user data folder (`evq admin demo --data-dir` moves it).
        "data_dir",
        # What nobody running evq needs to turn: the idle poll (LISTEN/NOTIFY wakes a worker);
        # the reconciler's patience; hourly caps beside the per-key daily one and the run's; the
        # largest message (1 MiB: providers' own limits are near it).
        "poll_interval",
        "reconcile_checks",
        "notice_on_unknown",
        "budget_key_hourly",
        "budget_domain_hourly",
        # Postmark's webhook URL carries EVQ_WEBHOOK_POSTMARK_TOKEN (basic auth: a Python caller's).
        "webhook_postmark_user",
        "webhook_postmark_password",
        # Followed from another setting (DERIVED below).
        "mcp_resolve",
        "mcp_approve",
        "rescue_interval",
        "retry_max",
        "circuit_probe_max",
        "journal_imap_ca_file",
        "ses_timeout",
        "metrics_host",
        "ops_timezone",
    }
)

# The constants that follow a setting: each is worked out from the settings after they are read
# (the defaults are these rules' values at the settings' defaults).
DERIVED: dict[str, tuple[str, Any]] = {
    # A rescuer pass every eighth of a lease: an expired claim waits at most that long.
    "rescue_interval": ("EVQ_LEASE_SECONDS / 8", lambda s: s.lease_seconds / 8),
    "retry_max": ("180 x EVQ_RETRY_BASE", lambda s: s.retry_base * 180),
    "circuit_probe_max": ("60 x EVQ_CIRCUIT_PROBE_BASE", lambda s: s.circuit_probe_base * 60),
    # The journal mailbox is usually on the mail server: the same private CA, if any.
    "journal_imap_ca_file": (
        "EVQ_SMTP_CA_FILE, with EVQ_JOURNAL_IMAP_URL",
        lambda s: s.smtp_ca_file if s.journal_imap_url else None,
    ),
    # One bound for every provider API evq speaks HTTP to.
    "ses_timeout": ("EVQ_HTTP_TIMEOUT", lambda s: s.http_timeout),
    # A worker's /metrics listens where `evq serve` would.
    "metrics_host": ("EVQ_SERVE_HOST", lambda s: s.serve_host),
    # The ops page shows times in the zone the approval hours are in.
    "ops_timezone": ("EVQ_APPROVAL_TIMEZONE", lambda s: s.approval_timezone),
    "mcp_resolve": ("`resolve` in EVQ_MCP_TOOLS", lambda s: "resolve" in s.mcp_tools),
    "mcp_approve": ("`approve` in EVQ_MCP_TOOLS", lambda s: "approve" in s.mcp_tools),
}

# The settings: every EVQ_* variable (and flag of `evq worker run`), at most 60
# (tests/unit/test_docs.py counts docs/settings.md's table).
OPTIONS: tuple[Option, ...] = tuple(o for o in _ALL if o.name not in CONSTANTS)
CONSTANT_OPTIONS: tuple[Option, ...] = tuple(o for o in _ALL if o.name in CONSTANTS)

OPTION_BY_NAME = {o.name: o for o in _ALL}


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
        for option in _ALL:
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
        out = [getattr(self, o.name) for o in _ALL if o.secret and getattr(self, o.name)]
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


# The tools EVQ_MCP_TOOLS may add to `evq mcp`'s.
MCP_TOOLS = ("resolve", "approve")

# The provider names a step may name. Which of them a given worker sends through is EVQ_ADAPTER.
ADAPTERS = ("smtp", "http", "ses", "null")


def _section(config: type[C], settings: Settings, prefix: str = "") -> C:
    """``config`` filled from the settings named ``prefix`` + each of its fields."""
    return config(**{f.name: getattr(settings, prefix + f.name) for f in fields(config)})


def _shown(default: Any) -> str:
    if isinstance(default, frozenset):
        default = "all" if default == frozenset(FAULTS) else ",".join(sorted(default)) or "none"
    elif isinstance(default, tuple):
        default = ",".join(map(str, default)) or "(none)"
    elif isinstance(default, bool):
        default = str(default).lower()
    return "(unset)" if default is None else str(default)


def markdown_table() -> str:
    """docs/settings.md's settings table (a test keeps the page equal to this, and counts it)."""
    lines = ["| variable | flag of `evq worker run` | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        lines.append(f"| `{o.env}` | `{o.flag}` | `{_shown(o.default)}` | {o.help} |")
    return "\n".join(lines)


def constants_table() -> str:
    """docs/settings.md's table of the documented constants: no variable sets them (the name is
    the variable that set each before 1.0, as messages still name the bound; the field is
    ``Settings``'s)."""
    lines = ["| constant (not read) | `Settings` field | value | meaning |", "|---|---|---|---|"]
    for o in CONSTANT_OPTIONS:
        value = (
            f"{DERIVED[o.name][0]} (`{_shown(o.default)}` by default)"
            if o.name in DERIVED
            else f"`{_shown(o.default)}`"
        )
        lines.append(f"| `{o.env}` | `{o.name}` | {value} | {o.help} |")
    return "\n".join(lines)
