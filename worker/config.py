"""The core's own config: only what the worker loop, its rescuer, reconciler, rate gate
and circuit breaker read, each an ``EVQ_*`` option.

The tables here are the core's share of the one loader's (ops/settings.py), which also
reads the adapters' and the interfaces' options and builds a :class:`WorkerConfig` from
them; the core never sees an SMTP, HTTP or `evq serve` option.
"""

from __future__ import annotations

from dataclasses import dataclass

from evq.worker.circuit import FAULTS, CircuitConfig, circuit_faults
from evq.worker.deadline import DEADLINE_SHARE
from evq.worker.options import Option, bad, boolean, duration, duration_or_forever, lowercase_list
from evq.worker.ratelimit import RateLimit, rate_limits

# How the loop claims, leases, retries and opens circuits.
WORKER_OPTIONS: tuple[Option, ...] = (
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
        "How long a step keeps being retried after temporary failures, from its enqueue, its approval or an operator's requeue (seconds, or 30m, 12h, 5d); then it is rejected (retry_budget_exhausted).",
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
)

# How it paces its sends (shared with every other worker), rescues expired leases and stops.
PACE_OPTIONS: tuple[Option, ...] = (
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
)

# What a request may be (worker/request.py's Policy); EVQ_MAX_INPUT_BYTES bounds what an
# interface reads before the policy judges any of it.
POLICY_OPTIONS: tuple[Option, ...] = (
    Option(
        "allowed_domains",
        lowercase_list,
        (),
        "Comma-separated recipient domains allowed (empty: all). Subdomains match.",
    ),
    Option("blocked_domains", lowercase_list, (), "Comma-separated recipient domains refused. Subdomains match."),
    Option(
        "internal_domains",
        lowercase_list,
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
    Option(
        "require_provenance",
        lowercase_list,
        (),
        "Decision fields every enqueue must carry, comma-separated, e.g. model,instruction_version "
        "(any of instruction_version, prompt_version, model, tool, rationale, decided_at; empty: none). "
        "A request without one is refused with a field error (decision.model, ...) and nothing is written.",
    ),
    Option(
        "refuse_unresolvable",
        boolean,
        False,
        "Refuse (E_UNRESOLVABLE, exit 2) an enqueue whose provider could never settle a lost answer: no dedupe, "
        "no lookup, no webhook (`evq providers list`: resolvable false). Off: such a step is enqueued and its "
        "answer says ambiguity: unresolvable.",
    ),
)

# Failure notices (worker/notices.py).
NOTICE_OPTIONS: tuple[Option, ...] = (
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
)

# The reconciler (worker/reconciler.py).
RECONCILE_OPTIONS: tuple[Option, ...] = (
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
)

# Content retention (worker/content_retention.py).
KEEP_CONTENT_DEFAULT = 30 * 86400.0
# Evidence partitions (worker/partitions.py).
EVIDENCE_PARTITION_STEPS_DEFAULT = 1_000_000
EVIDENCE_PARTITION_STEPS_MOST = 1_000_000_000  # the database refuses more (evq_evidence_partitions_ahead)
RETENTION_OPTIONS: tuple[Option, ...] = (
    Option(
        "keep_content",
        duration_or_forever,
        KEEP_CONTENT_DEFAULT,
        "How long a closed (accepted or rejected) step keeps its message text and html after it closed "
        "(seconds, or 12h, 30d; 0: remove at close; forever: never); then the worker replaces them with their "
        "sizes and SHA-256, keeping headers, recipients and payload_sha256 (the proof of what was sent). "
        "Open steps always keep it. Default 30d: long enough to look into a complaint or a bounce, "
        "short enough that bodies (personal data) do not pile up for as long as the evidence is kept.",
        minimum=0,
    ),
    Option(
        "evidence_partition_steps",
        int,
        EVIDENCE_PARTITION_STEPS_DEFAULT,
        "Step ids per evidence partition (PostgreSQL): evidence is partitioned by its step's id, and "
        "evq prune drops a whole partition once every step in it closed before the cutoff. The worker "
        "keeps four partitions ahead of the newest step, checking once a minute. Aim for a partition a "
        "day or so (100000000 at 100 million sends a day); a new size applies to partitions made after. "
        "At most 1000000000: one partition covering every future step would never be dropped.",
        minimum=1000,
        maximum=EVIDENCE_PARTITION_STEPS_MOST,
    ),
)

_OPTION = {o.name: o for o in (*WORKER_OPTIONS, *PACE_OPTIONS, *RECONCILE_OPTIONS, *RETENTION_OPTIONS)}


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What worker/runner.py reads; the fields are the options of WORKER_OPTIONS,
    PACE_OPTIONS, RECONCILE_OPTIONS and RETENTION_OPTIONS, with their defaults (a unit test
    compares them)."""

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
    rate_limit: tuple[RateLimit, ...] = ()
    rescue_interval: float = 15.0
    shutdown_grace: float = 30.0
    reconcile_interval: float = 30.0
    reconcile_rate: float = 2.0
    reconcile_checks: int = 5
    keep_content: float | None = KEEP_CONTENT_DEFAULT  # seconds after close; None: forever
    evidence_partition_steps: int = EVIDENCE_PARTITION_STEPS_DEFAULT

    def validate(self) -> None:
        """The checks between the core's own options (each option's minimum is the loader's)."""
        if self.circuit_probe_max < self.circuit_probe_base:
            raise bad(_OPTION["circuit_probe_max"], "must be at least EVQ_CIRCUIT_PROBE_BASE")
        if self.retry_max < self.retry_base:
            raise bad(_OPTION["retry_max"], "must be at least EVQ_RETRY_BASE")

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
