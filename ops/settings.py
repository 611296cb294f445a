"""Settings: every one an ``EVQ_*`` environment variable and a flag of ``evq worker run``.

One declarative table (:data:`OPTIONS`) is the single source for the flags, the
environment names, the defaults, the README's settings table (a test compares them)
and the validation messages, so none of them can drift from the others.
"""

from __future__ import annotations

import math
import os
import re
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlsplit

from email_validator import EmailNotValidError

from evq.worker.circuit import FAULTS, CircuitConfig, circuit_faults
from evq.worker.deadline import DEADLINE_SHARE
from evq.worker.errors import ConfigError
from evq.worker.notices import NoticeConfig, reserved_sender
from evq.worker.ratelimit import RateLimit, rate_limits
from evq.worker.request import Policy, validate_address

# A HELO/EHLO name: a domain of at least two labels, or an RFC 5321 address literal.
_HELO_NAME = re.compile(
    r"^(?:(?=.{1,253}$)(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"|\[(?:\d{1,3}(?:\.\d{1,3}){3}|IPv6:[0-9A-Fa-f:.]+)\])$"
)


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip().lower() for part in value.split(",") if part.strip())


def boolean(value: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


_DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(value: str) -> float:
    """Seconds, or a number with s, m, h or d: ``5d``, ``12h``, ``90``."""
    text = value.strip().lower()
    unit = _DURATION_UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ValueError("expected seconds or a number with s, m, h or d (e.g. 5d)") from None
    if not seconds == seconds or seconds in (float("inf"), float("-inf")):
        raise ValueError("expected a finite duration")
    return seconds


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    secret: bool = False
    minimum: float | None = None

    @property
    def env(self) -> str:
        return "EVQ_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("database_url", str, None, "PostgreSQL URL. Unset: an embedded PostgreSQL in EVQ_DATA_DIR.", secret=True),
    Option(
        "data_dir",
        str,
        None,
        "Folder for the embedded PostgreSQL (default: the user data dir, e.g. ~/.local/share/evq).",
    ),
    Option(
        "adapter", _csv, ("smtp",), "Provider adapter(s) this worker sends through, comma-separated: smtp, http, null."
    ),
    Option("concurrency", int, 10, "Sends in flight at once per worker process.", minimum=1),
    Option("batch_size", int, 100, "Most rows claimed by one claim statement.", minimum=1),
    Option("lease_seconds", float, 120.0, "How long a claim is held; must exceed the adapter timeout.", minimum=1),
    Option(
        "max_attempts",
        int,
        1000,
        "Charged attempts before a step that keeps failing temporarily is rejected (a backstop: EVQ_RETRY_FOR decides first).",
        minimum=1,
    ),
    Option(
        "poll_interval", float, 1.0, "Seconds between claims when idle (LISTEN/NOTIFY wakes it sooner).", minimum=0.01
    ),
    Option("retry_base", float, 5.0, "First retry delay in seconds; doubles per attempt, with jitter.", minimum=0),
    Option("retry_max", float, 900.0, "Longest retry delay in seconds.", minimum=0),
    Option(
        "retry_for",
        duration,
        432000.0,
        "How long a step keeps being retried after temporary failures, from its enqueue (seconds, or 30m, 12h, 5d); then it is rejected (retry_budget_exhausted).",
        minimum=1,
    ),
    Option(
        "circuit_faults",
        circuit_faults,
        frozenset(FAULTS),
        "Provider-level faults that open a provider's circuit at once and cost the message no attempt: "
        + ", ".join(FAULTS)
        + " (or all, none).",
    ),
    Option(
        "circuit_failures",
        int,
        10,
        "Consecutive temporary failures (seen by one worker) that open a provider's circuit (0: only the faults do).",
        minimum=0,
    ),
    Option(
        "circuit_probe_base",
        float,
        10.0,
        "Seconds from a circuit's opening to its first probe; doubles after each failed probe.",
        minimum=0.1,
    ),
    Option(
        "circuit_probe_max", float, 600.0, "Longest wait between probes of an open circuit, in seconds.", minimum=0.1
    ),
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
        "rate_limit",
        rate_limits,
        (),
        "Requests per provider, shared by every worker on every host (kept in PostgreSQL), e.g. "
        "http=2/s,smtp=100/min; :N after a rate sets the burst (default: one second's worth). "
        "A 429 from a limited provider pauses it for every worker. Unset: no limit, no extra statement.",
    ),
    Option("rescue_interval", float, 15.0, "Seconds between rescuer passes over expired leases.", minimum=0.1),
    Option(
        "shutdown_grace",
        float,
        30.0,
        "Seconds SIGTERM waits for in-flight sends before leaving them to the rescuer.",
        minimum=0,
    ),
    Option("allowed_domains", _csv, (), "Comma-separated recipient domains allowed (empty: all). Subdomains match."),
    Option("blocked_domains", _csv, (), "Comma-separated recipient domains refused. Subdomains match."),
    Option(
        "internal_domains",
        _csv,
        (),
        "Comma-separated special-use domains (RFC 6761 and kin: .test, .local, .localhost, .invalid, .arpa, .onion) "
        "your mail servers really deliver to, e.g. corp.local,mail.test; the address validator refuses every other "
        "one. Subdomains match.",
    ),
    Option("max_message_bytes", int, 1024 * 1024, "Largest normalized request, in bytes.", minimum=1024),
    Option("max_recipients", int, 50, "Most recipients (to + cc + bcc) per message.", minimum=1),
    Option(
        "max_input_bytes",
        int,
        64 * 1024 * 1024,
        "Most bytes of request input read at once: the whole file or stdin `evq enqueue` reads "
        "(all its JSON Lines together), and one line sent to `evq mcp` (E_INVALID_ARG beyond).",
        minimum=1024,
    ),
    Option("default_from", str, None, "Sender used when a request has no 'from'."),
    Option("smtp_host", str, "localhost", "SMTP server host."),
    Option("smtp_port", int, 25, "SMTP server port.", minimum=1),
    Option("smtp_username", str, None, "SMTP AUTH user (optional)."),
    Option("smtp_password", str, None, "SMTP AUTH password (never logged).", secret=True),
    Option(
        "smtp_tls", str, "none", "SMTP transport security: none, starttls, ssl.", choices=("none", "starttls", "ssl")
    ),
    Option("smtp_timeout", float, 30.0, "Seconds for each SMTP network operation.", minimum=0.1),
    Option(
        "smtp_helo_name",
        str,
        None,
        "Name evq greets the SMTP server with (EHLO/HELO). Unset: the host's fully-qualified name if it has a dot, "
        "else the address literal of the connection, e.g. [10.0.0.5] (never 'localhost', which strict servers refuse).",
    ),
    Option(
        "smtp_ca_file",
        str,
        None,
        "PEM bundle of the CA(s) trusted for the SMTP server's certificate (a private CA); unset: the system's trust store.",
    ),
    Option(
        "smtp_client_cert",
        str,
        None,
        "PEM client certificate (chain) for SMTP servers that require one; with EVQ_SMTP_CLIENT_KEY.",
    ),
    Option(
        "smtp_client_key",
        str,
        None,
        "PEM private key of EVQ_SMTP_CLIENT_CERT (unset: the key is in the certificate file).",
    ),
    Option(
        "smtp_allow_plain_auth",
        boolean,
        False,
        "Allow SMTP AUTH (EVQ_SMTP_USERNAME) over a connection without TLS, i.e. the password in clear; "
        "only for a trusted network. Default: refused.",
    ),
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
        "notice_from",
        str,
        None,
        "Sender of failure notices, refused from every caller (default: evq-notices@ the failed step's sender domain).",
    ),
    Option(
        "notice_on_unknown",
        boolean,
        False,
        "Also send a notice when a step becomes unknown (outcome uncertain, an operator will check).",
    ),
    Option(
        "reconcile_interval",
        float,
        30.0,
        "Seconds between reconciler passes over unknown rows whose provider can look messages up.",
        minimum=0.1,
    ),
    Option("reconcile_rate", float, 2.0, "Most provider lookups per second, per worker.", minimum=0.01),
    Option(
        "reconcile_checks",
        int,
        5,
        "Lookups per unknown row before it is left to an operator alone (0: no reconciler).",
        minimum=0,
    ),
    Option("null_delay", float, 0.0, "Seconds the null (benchmark) adapter waits before accepting.", minimum=0),
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
        "mcp_resolve",
        boolean,
        False,
        "Offer the evq_steps_resolve tool on `evq mcp` (it dry-runs unless told dry_run: false).",
    ),
)

OPTION_BY_NAME = {o.name: o for o in OPTIONS}


@dataclass(frozen=True, slots=True)
class Settings:
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
    http_base_url: str = "https://api.resend.com"
    http_api_key: str | None = None
    http_timeout: float = 10.0
    http_dedupe_window: float = 86400.0
    notice_from: str | None = None
    notice_on_unknown: bool = False
    reconcile_interval: float = 30.0
    reconcile_rate: float = 2.0
    reconcile_checks: int = 5
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
    mcp_resolve: bool = False

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Environment first, then explicit overrides (flags); every value validated."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for option in OPTIONS:
            raw = env.get(option.env)
            if raw is not None and raw != "":
                values[option.name] = _parse(option, raw, source=option.env)
        for name, value in overrides.items():
            if value is None:
                continue
            option = OPTION_BY_NAME[name]
            values[name] = _parse(option, value, source=option.flag) if isinstance(value, str) else value
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        for option in OPTIONS:
            value = getattr(self, option.name)
            if isinstance(value, float) and not math.isfinite(value):
                # float() reads "nan", "inf" and "1e999"; NaN passes every minimum (all its
                # comparisons are false). Either would be a lease, a timeout or a window that
                # no clock, socket or PostgreSQL interval can hold.
                raise _bad(option, f"must be a finite number, got {value}")
            if option.minimum is not None and value is not None and value < option.minimum:
                raise _bad(option, f"must be at least {option.minimum:g}, got {value}")
            if option.choices and value not in option.choices:
                raise _bad(option, f"must be one of {', '.join(option.choices)}, got {value!r}")
        for name in self.adapter:
            if name not in ADAPTERS:
                raise _bad(OPTION_BY_NAME["adapter"], f"unknown adapter {name!r}; known: {', '.join(ADAPTERS)}")
        if not self.adapter:
            raise _bad(OPTION_BY_NAME["adapter"], "name at least one adapter")
        if "smtp" in self.adapter and self.lease_seconds <= self.smtp_timeout * 3:
            # One SMTP send is several network operations, each bounded by smtp_timeout;
            # a lease shorter than that would let the rescuer act on a send still talking.
            raise _bad(
                OPTION_BY_NAME["lease_seconds"],
                f"must exceed 3 x EVQ_SMTP_TIMEOUT ({self.smtp_timeout * 3:g}s) so a live send is never rescued",
            )
        if self.pooler == "transaction" and self.listen == "on":
            raise _bad(
                OPTION_BY_NAME["listen"], "cannot be on behind a transaction-mode pooler (notifications never arrive)"
            )
        if bool(self.smtp_username) != bool(self.smtp_password) and "smtp" in self.adapter:
            raise _bad(OPTION_BY_NAME["smtp_username"], "and EVQ_SMTP_PASSWORD go together: set both or neither")
        if "smtp" in self.adapter:
            self._validate_smtp()
        for limit in self.rate_limit:
            if limit.provider not in ADAPTERS:
                raise _bad(
                    OPTION_BY_NAME["rate_limit"],
                    f"names an unknown provider {limit.provider!r}; known: {', '.join(ADAPTERS)}",
                )
        if self.circuit_probe_max < self.circuit_probe_base:
            raise _bad(OPTION_BY_NAME["circuit_probe_max"], "must be at least EVQ_CIRCUIT_PROBE_BASE")
        if self.retry_max < self.retry_base:
            raise _bad(OPTION_BY_NAME["retry_max"], "must be at least EVQ_RETRY_BASE")
        if self.serve_port > 65535:
            raise _bad(OPTION_BY_NAME["serve_port"], f"must be a TCP port (at most 65535), got {self.serve_port}")
        if self.metrics_port is not None and self.metrics_port > 65535:
            raise _bad(OPTION_BY_NAME["metrics_port"], f"must be a TCP port (at most 65535), got {self.metrics_port}")
        if "http" in self.adapter:
            self._validate_http()
        if self.notice_from is not None:
            try:
                validate_address(self.notice_from, self.internal_domains)
            except EmailNotValidError as exc:
                raise _bad(OPTION_BY_NAME["notice_from"], f"is not a valid address: {exc}") from None

    def _validate_smtp(self) -> None:
        if self.smtp_username and self.smtp_tls == "none" and not self.smtp_allow_plain_auth:
            raise _bad(
                OPTION_BY_NAME["smtp_username"],
                "would send the SMTP password without TLS: set EVQ_SMTP_TLS=starttls or ssl "
                "(or EVQ_SMTP_ALLOW_PLAIN_AUTH=true on a trusted network)",
            )
        if self.smtp_helo_name is not None and not _HELO_NAME.match(self.smtp_helo_name):
            raise _bad(
                OPTION_BY_NAME["smtp_helo_name"],
                f"must be a fully-qualified domain name or an address literal such as [192.0.2.1], got {self.smtp_helo_name!r}",
            )
        if self.smtp_client_key and not self.smtp_client_cert:
            raise _bad(OPTION_BY_NAME["smtp_client_key"], "needs EVQ_SMTP_CLIENT_CERT")
        for name in ("smtp_ca_file", "smtp_client_cert", "smtp_client_key"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise _bad(OPTION_BY_NAME[name], f"names no readable file: {path!r}")
        # Read now, so a bad bundle or key fails at startup with its setting named,
        # not as every send's TLS failure.
        context = ssl.create_default_context()
        if self.smtp_ca_file:
            try:
                context.load_verify_locations(cafile=self.smtp_ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise _bad(OPTION_BY_NAME["smtp_ca_file"], f"cannot be loaded as a PEM CA bundle: {exc}") from None
        if self.smtp_client_cert:
            try:
                context.load_cert_chain(self.smtp_client_cert, self.smtp_client_key)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise _bad(OPTION_BY_NAME["smtp_client_cert"], f"and its key cannot be loaded: {exc}") from None

    def _validate_http(self) -> None:
        if not self.http_api_key:
            raise _bad(OPTION_BY_NAME["http_api_key"], "is required with EVQ_ADAPTER=http")
        if urlsplit(self.http_base_url).scheme not in ("http", "https"):
            raise _bad(OPTION_BY_NAME["http_base_url"], f"must be an http(s) URL, got {self.http_base_url!r}")
        if self.lease_seconds <= self.http_timeout * 3:
            # Connect, send and answer are each bounded by http_timeout.
            raise _bad(
                OPTION_BY_NAME["lease_seconds"],
                f"must exceed 3 x EVQ_HTTP_TIMEOUT ({self.http_timeout * 3:g}s) so a live send is never rescued",
            )

    @property
    def send_deadline(self) -> float:
        """Hard ceiling on one adapter call, measured from the claim (worker/deadline.py)."""
        return self.lease_seconds * DEADLINE_SHARE

    def circuit(self) -> CircuitConfig:
        return CircuitConfig(
            faults=self.circuit_faults,
            failures=self.circuit_failures,
            probe_base=self.circuit_probe_base,
            probe_max=self.circuit_probe_max,
        )

    def policy(self) -> Policy:
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
        )

    def notices(self) -> NoticeConfig:
        return NoticeConfig(
            sender=self.notice_from, on_unknown=self.notice_on_unknown, internal_domains=self.internal_domains
        )

    def secrets(self) -> list[str]:
        """Values that must never appear in a log line, an evidence row or an error."""
        out = [getattr(self, o.name) for o in OPTIONS if o.secret and getattr(self, o.name)]
        if self.database_url:
            try:
                password = urlsplit(self.database_url).password
            except ValueError:
                password = None
            if password:
                out.append(password)
        return out

    def as_public_dict(self) -> dict[str, Any]:
        return {
            f.name: ("***" if OPTION_BY_NAME[f.name].secret and getattr(self, f.name) else getattr(self, f.name))
            for f in fields(self)
        }


# The provider names a step may name. Which of them a given worker sends through is EVQ_ADAPTER.
ADAPTERS = ("smtp", "http", "null")


def _parse(option: Option, raw: str, *, source: str) -> Any:
    try:
        return option.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{source}: cannot read {raw if not option.secret else '***'!r}: {exc}",
            hint=f"{option.env} / {option.flag}: {option.help}",
            field=source,
        ) from None


def _bad(option: Option, message: str) -> ConfigError:
    return ConfigError(f"{option.env} ({option.flag}) {message}", hint=option.help, field=option.env)


def markdown_table() -> str:
    """The README's settings table (a test keeps the README equal to this)."""
    lines = ["| variable | flag of `evq worker run` | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        default = o.default
        if isinstance(default, frozenset):
            default = "all" if default == frozenset(FAULTS) else ",".join(sorted(default)) or "none"
        elif isinstance(default, tuple):
            default = ",".join(map(str, default)) or "(none)"
        elif isinstance(default, bool):
            default = str(default).lower()
        lines.append(f"| `{o.env}` | `{o.flag}` | `{'(unset)' if default is None else default}` | {o.help} |")
    return "\n".join(lines)
