"""The catalogue of every metric evq counts in process (Oban's telemetry.ex habit:
one place to read what is measured). Labels come only from small fixed sets;
never an id, an address or a key.

Database-derived gauges (rows per status, age of the oldest unknown row) are read
at scrape time by ops/metrics.py, not counted here.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

STORE_SECONDS = Histogram(
    "evq_store_operation_duration_seconds",
    "Time spent in one store operation (one statement or transaction).",
    ["operation", "outcome"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ENQUEUED = Counter("evq_enqueued_total", "Steps created by enqueue (repeats of an existing key not counted).")
VALIDATION_ERRORS = Counter(
    "evq_validation_errors_total", "Requests refused before anything was written.", ["reason"]
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
RESCUED = Counter("evq_rescued_total", "In-flight rows whose lease expired, by the state they moved to.", ["to"])
FENCE_REJECTIONS = Counter(
    "evq_fence_rejections_total", "Answers that arrived after their lease was lost (kept as evidence only)."
)
LATE_SETTLEMENTS = Counter(
    "evq_late_settlements_total", "Rows closed by a definite answer that arrived after their rescue."
)
NOTICES = Counter("evq_notices_total", "Failure notices enqueued (one per step that owes one, ever).")
RECONCILED = Counter(
    "evq_reconciler_lookups_total",
    "Reconciler lookups of unknown rows, by what the provider said: found, absent, failed.",
    ["answer"],
)
