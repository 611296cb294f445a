"""Every option: each one an ``EVQ_*`` environment variable and a flag of ``evq worker run``,
or a documented constant.

Each config declares its own table where it is used (the core's in worker/config.py, the
SMTP adapter's in adapters/smtp/config.py, the HTTP adapter's in adapters/http/config.py,
the SES adapter's in adapters/ses/config.py, the null adapter's in adapters/null.py); the
database, logging, /metrics, `evq serve` and `evq mcp` options, which only the interfaces
and the composition root read, are here. :data:`OPTIONS` joins them and is the single
source for the flags, the environment names, the defaults, the README's settings table (a
test compares them) and the validation messages, so none of them can drift from the others.
ops/settings.py reads them into :class:`~evq.ops.settings.Settings`.
"""

from __future__ import annotations

from typing import Any

from evq.adapters import null
from evq.adapters.http import config as http
from evq.adapters.ses import config as ses
from evq.adapters.smtp import config as smtp
from evq.adapters.webhooks import config as webhooks
from evq.ops.time_zones import time_zone
from evq.worker.approval_policy import approval_options
from evq.worker.circuit import FAULTS
from evq.worker.config import (
    NOTICE_OPTIONS,
    PACE_OPTIONS,
    POLICY_OPTIONS,
    RECONCILE_OPTIONS,
    RETENTION_OPTIONS,
    WORKER_OPTIONS,
)
from evq.worker.options import Option, boolean, duration, lowercase_list

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
ALL_OPTIONS: tuple[Option, ...] = (
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
OPTIONS: tuple[Option, ...] = tuple(o for o in ALL_OPTIONS if o.name not in CONSTANTS)
CONSTANT_OPTIONS: tuple[Option, ...] = tuple(o for o in ALL_OPTIONS if o.name in CONSTANTS)

OPTION_BY_NAME = {o.name: o for o in ALL_OPTIONS}

# The tools EVQ_MCP_TOOLS may add to `evq mcp`'s.
MCP_TOOLS = ("resolve", "approve")

# The provider names a step may name. Which of them a given worker sends through is EVQ_ADAPTER.
ADAPTERS = ("smtp", "http", "ses", "null")


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
