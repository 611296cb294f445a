"""The catalogue of every metric evq counts in process (Oban's telemetry.ex habit:
one place to read what is measured). Labels come only from the small fixed sets
named here; never an id, an address or a key.

Database-derived gauges (rows per status, age of the oldest unknown row) are read
at scrape time by ops/app/metrics.py, not counted here; their bucket bounds live here
so that every number about unknown rows is defined in one file.
"""

from __future__ import annotations

import time
from datetime import datetime
from functools import lru_cache
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

# The *_created series double the series count and nothing here reads them.
disable_created_metrics()

# Label values, fixed. A counter is created at 0 for each, so rate() and ratios see
# the series from the first scrape instead of missing the first increment.
OUTCOMES = ("accepted", "rejected", "retryable", "unknown")
RESCUED_TO = ("unknown", "retryable")
# What the reconciler (issue 4) learned about an unknown row: the provider has it
# (accepted), says it has no such message (not_found: the row stays unknown, absence
# is not proof), or could not be asked (error). A lookup never proves a refusal.
RECONCILE_RESULTS = ("accepted", "not_found", "error")
# An operator's verdict on an unknown row (`evq steps resolve --as`).
RESOLUTIONS_AS = ("accepted", "rejected", "retry")
# What became of a held send or a cancelled one (issue 17: ops/app/approvals.py, worker/approval_actions.py).
HELD_DECISIONS = ("approved", "denied", "cancelled", "expired")
# Why a claim left rows of a rate-limited provider for later (worker/ratelimit.py).
RATE_LIMITED_REASONS = ("tokens", "paused")

# Why `evq serve` turned a client away unanswered by the app (ops/web/throttle.py, ops/web/slowclients.py):
# too many wrong keys from its address, headers or body not in time, closed to make room
# under the connection cap, or refused because every connection was being answered.
SERVE_REFUSED_REASONS = ("throttled", "header_timeout", "body_timeout", "unread", "evicted", "full")

# Ages of unknown rows, 1 minute to 7 days (the scrape-time gauge histogram).
UNKNOWN_AGE_BUCKETS = (60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 604800.0)
# Waiting times of rows claimable now (evq_pending_age_seconds): a healthy queue drains
# in seconds, a stalled one shows in minutes to hours.
PENDING_AGE_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


@lru_cache(maxsize=4096)
def labelled(metric: Any, *values: str) -> Any:
    """``metric.labels(*values)``, looked up once: label sets come from small fixed
    sets, and the lookup (a lock and a dict) is a real share of a send's cost."""
    return metric.labels(*values)


STORE_SECONDS = Histogram(
    "evq_store_operation_duration_seconds",
    "Time spent in one store operation (one statement or transaction).",
    ["operation", "outcome"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ENQUEUED = Counter("evq_enqueued_total", "Steps created by enqueue (repeats of an existing key not counted).")
VALIDATION_ERRORS = Counter(
    "evq_validation_errors_total", "Requests refused before anything was written, by the failing field.", ["reason"]
)
DECISION_TO_ENQUEUE = Histogram(
    "evq_decision_to_enqueue_seconds",
    "From the agent's decision (decision.decided_at, the agent's clock) to the step's enqueue (the database's).",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)
SEND_ATTEMPTS = Counter(
    "evq_send_attempts_total", "Adapter calls by provider and the adapter's answer.", ["provider", "outcome"]
)
SEND_SECONDS = Histogram(
    "evq_send_duration_seconds",
    "Time one adapter call took, by provider and answer.",
    ["provider", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
ACTION_TO_EVIDENCE = Histogram(
    "evq_action_to_evidence_seconds",
    "From enqueue to the evidence that closed the step (accepted or rejected), retries and waits included.",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400, 604800),
)
RESCUED = Counter(
    "evq_rescued_total",
    "Rows the rescuer moved (expired leases; retryable rows whose dedupe window closed), by the state they moved to.",
    ["to"],
)
RECONCILED = Counter(
    "evq_reconciled_total", "Unknown rows the reconciler asked the provider about, by what it learned.", ["result"]
)
REDACTED = Counter(
    "evq_content_redacted_total",
    "Closed steps whose message body content retention (EVQ_KEEP_CONTENT) removed, sizes and SHA-256 kept.",
)
RESOLUTIONS = Counter("evq_resolutions_total", "Unknown rows closed by an operator, by verdict.", ["as"])
APPROVALS = Counter(
    "evq_held_decisions_total",
    "Held sends approved, denied or expired, and sends cancelled before they went out.",
    ["decision"],
)
FENCE_REJECTIONS = Counter(
    "evq_fence_rejections_total", "Answers that arrived after their lease was lost (kept as evidence only)."
)
LATE_SETTLEMENTS = Counter(
    "evq_late_settlements_total", "Rows closed by a definite answer that arrived after their rescue."
)
RATE_LIMITED = Counter(
    "evq_rate_limited_total",
    "Claims that took fewer rows of a provider than they had slots for: its shared rate limit "
    "(tokens) or its pause after a 429 (paused).",
    ["provider", "reason"],
)
PROVIDER_PAUSES = Counter(
    "evq_provider_pauses_total",
    "Answers that said we send too fast (HTTP 429) and paused the whole provider.",
    ["provider"],
)
PROVIDER_PAUSED_UNTIL = Gauge(
    "evq_provider_paused_until_timestamp_seconds",
    "When the provider's latest pause known to this process ends (Unix time; 0: none seen).",
    ["provider"],
)
RECIPIENTS_REFUSED = Counter(
    "evq_recipients_refused_total",
    "Recipients a provider refused while it accepted the message for others (a partial refusal), by provider.",
    ["provider"],
)
CIRCUIT_STATES = ("closed", "half_open", "open")
CIRCUIT_CHANGES = Counter(
    "evq_provider_circuit_changes_total",
    "Changes of a provider's circuit made by this process (state: open, half_open, closed; worker/circuit.py).",
    ["provider", "state"],
)
UNCHARGED_ATTEMPTS = Counter(
    "evq_uncharged_attempts_total",
    "Attempts that hit a provider-level fault or an open circuit: not counted against their message.",
    ["provider"],
)
NOTICES = Counter("evq_notices_total", "Failure notices enqueued (one per step that owes one, ever).")
# Delivery events from providers' webhooks (worker/delivery.py), counted by the process that
# stored them (`evq serve`): sum() across instances. Bounce and complaint rates are these over
# accepted sends (ops/prometheus/rules/recording.yml). Duplicates are not counted again.
DELIVERY_EVENTS = Counter(
    "evq_delivery_events_total", "Delivery events stored, by webhook provider and type.", ["provider", "type"]
)
DELIVERY_UNMATCHED = Counter(
    "evq_delivery_events_unmatched_total",
    "Delivery events that matched no step (kept for an operator: `evq deliveries list --unmatched`).",
    ["provider"],
)
DELIVERY_SETTLED = Counter(
    "evq_delivery_settled_total", "Unknown steps closed accepted by a webhook event (reason webhook).", ["provider"]
)
ACCEPTED_TO_DELIVERED = Histogram(
    "evq_accepted_to_delivered_seconds",
    "From the step's acceptance to the provider's delivered event (its time, else evq's).",
    ["provider"],
    buckets=(1, 5, 15, 30, 60, 300, 900, 3600, 14400, 86400),
)
SERVE_REFUSED = Counter(
    "evq_serve_refused_total",
    "Clients `evq serve` turned away: throttled (too many wrong keys), header_timeout, body_timeout, "
    "unread (an answer the client did not read within the body timeout), evicted (closed for a newcomer under the connection cap), full (every connection busy).",
    ["reason"],
)
# Provider webhooks `evq serve` refused (worker/ports/webhooks.py's REFUSAL_REASONS): never stored.
WEBHOOK_REFUSED = Counter(
    "evq_webhook_refused_total",
    "Provider delivery webhooks `evq serve` refused (POST /v1/webhooks/{provider}), by provider and reason: "
    "unsigned, bad_signature, replayed, too_large, malformed, not_configured, wrong_topic, foreign_cert, ...",
    ["provider", "reason"],
)

for _to in RESCUED_TO:
    RESCUED.labels(to=_to)
for _result in RECONCILE_RESULTS:
    RECONCILED.labels(result=_result)
for _as in RESOLUTIONS_AS:
    RESOLUTIONS.labels(**{"as": _as})
for _decision in HELD_DECISIONS:
    APPROVALS.labels(_decision)
for _reason in SERVE_REFUSED_REASONS:
    SERVE_REFUSED.labels(reason=_reason)


def init_provider(provider: str) -> None:
    """Create a provider's send series at 0, so its retry and unknown ratios exist from the start."""
    for outcome in OUTCOMES:
        SEND_ATTEMPTS.labels(provider=provider, outcome=outcome)
        SEND_SECONDS.labels(provider=provider, outcome=outcome)
    for reason in RATE_LIMITED_REASONS:
        RATE_LIMITED.labels(provider=provider, reason=reason)
    PROVIDER_PAUSES.labels(provider=provider)
    RECIPIENTS_REFUSED.labels(provider=provider)
    PROVIDER_PAUSED_UNTIL.labels(provider=provider)
    for state in CIRCUIT_STATES:
        CIRCUIT_CHANGES.labels(provider=provider, state=state)
    UNCHARGED_ATTEMPTS.labels(provider=provider)


def observe_decision_to_enqueue(decided_at: datetime | None, enqueued_at: datetime) -> None:
    if decided_at is not None:
        # Two clocks (the agent's and the database's): a decision "after" its enqueue
        # is skew, counted as 0 rather than dragging the sum below zero.
        DECISION_TO_ENQUEUE.observe(max(0.0, (enqueued_at - decided_at).total_seconds()))


def init_delivery(provider: str, types: tuple[str, ...]) -> None:
    """Create a webhook provider's delivery series at 0 (the route calls it), so rates exist from the start."""
    for kind in types:
        DELIVERY_EVENTS.labels(provider=provider, type=kind)
    DELIVERY_UNMATCHED.labels(provider=provider)
    DELIVERY_SETTLED.labels(provider=provider)


def observe_delivery(provider: str, kind: str, *, matched: bool, settled: bool) -> None:
    """One stored (not duplicate) delivery event; ``kind`` is one of worker/delivery.py's types."""
    labelled(DELIVERY_EVENTS, provider, kind).inc()
    if not matched:
        labelled(DELIVERY_UNMATCHED, provider).inc()
    if settled:
        labelled(DELIVERY_SETTLED, provider).inc()


def observe_delivered(provider: str, accepted_at: datetime | None, delivered_at: datetime | None) -> None:
    if accepted_at is not None and delivered_at is not None:
        # Two clocks (the provider's and the database's): skew counts as 0.
        labelled(ACCEPTED_TO_DELIVERED, provider).observe(max(0.0, (delivered_at - accepted_at).total_seconds()))


def observe_closed(created_at: datetime, closed_at: datetime) -> None:
    """A step reached accepted or rejected: the worker, the reconciler and operators all call this."""
    ACTION_TO_EVIDENCE.observe(max(0.0, (closed_at - created_at).total_seconds()))


def observe_closed_now(created_at: datetime) -> None:
    """:func:`observe_closed` at this instant, as the worker calls it once a send: from the Unix
    clock, with no datetime made for now."""
    ACTION_TO_EVIDENCE.observe(max(0.0, time.time() - created_at.timestamp()))
