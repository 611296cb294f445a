"""The metric catalogue and the queue collector's shape, with readers passed in (no database)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from evq.ops.app.metrics import QueueCollector, build_registry, exported_names, render
from evq.ops.settings import Settings
from evq.ops.wiring import metrics_registry
from evq.worker import metrics
from evq.worker.delivery import DELIVERY_TYPES
from evq.worker.enqueue import validate
from evq.worker.errors import ConfigError, DatabaseUnavailable, InvalidRequest
from evq.worker.records import QueueStats
from evq.worker.states import Status
from tests.support import POLICY, request

STATS = QueueStats(
    steps={"held": 0, "pending": 3, "in_flight": 2, "retryable": 1, "unknown": 3, "accepted": 40, "rejected": 4},
    unknown_oldest_age=259200.0,
    unknown_age_sum=264690.0,
    unknown_buckets=tuple(
        (le, n) for le, n in zip(metrics.UNKNOWN_AGE_BUCKETS, (0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3), strict=True)
    ),
    pending_oldest_age=600.0,
    in_flight_expired=1,
    held_oldest_age=7200.0,
)


def _page(*collectors) -> dict:
    body, content_type = render(build_registry(*collectors))
    assert content_type.startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_collector_exports_every_status_and_cumulative_age_buckets():
    page = _page(QueueCollector(lambda buckets: STATS))
    assert {s: page[("evq_steps", (("status", s),))] for s in Status} == STATS.steps
    assert page[("evq_unknown_oldest_age_seconds", ())] == 259200.0
    assert page[("evq_pending_oldest_age_seconds", ())] == 600.0
    assert page[("evq_held_oldest_age_seconds", ())] == 7200.0
    assert page[("evq_in_flight_expired", ())] == 1
    buckets = [page[("evq_unknown_age_seconds_bucket", (("le", f"{le:.1f}"),))] for le in metrics.UNKNOWN_AGE_BUCKETS]
    assert buckets == [0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3]
    assert page[("evq_unknown_age_seconds_bucket", (("le", "+Inf"),))] == 3  # every unknown row
    assert page[("evq_unknown_age_seconds_gcount", ())] == 3
    assert page[("evq_unknown_age_seconds_gsum", ())] == 264690.0
    assert page[("evq_collector_up", ())] == 1
    assert page[("evq_collector_duration_seconds", ())] >= 0


def test_collector_exports_pending_waits_and_every_processs_refusals():
    stats = QueueStats(
        **{
            **{f: getattr(STATS, f) for f in STATS.__dataclass_fields__},
            "pending_due": 4,
            "pending_age_sum": 700.0,
            "pending_buckets": tuple((le, min(i, 4)) for i, le in enumerate(metrics.PENDING_AGE_BUCKETS)),
            "refusals": {("http", "decision"): 3, ("python", "to"): 1},
        }
    )
    page = _page(QueueCollector(lambda buckets: stats))
    assert page[("evq_pending_age_seconds_bucket", (("le", "1.0"),))] == 0
    assert page[("evq_pending_age_seconds_bucket", (("le", "+Inf"),))] == 4
    assert page[("evq_pending_age_seconds_gsum", ())] == 700.0
    assert page[("evq_enqueue_refusals_total", (("field", "decision"), ("interface", "http")))] == 3
    assert page[("evq_enqueue_refusals_total", (("field", "to"), ("interface", "python")))] == 1
    # Described without a read, so registering the collector runs no query.
    assert {"evq_pending_age_seconds_bucket", "evq_enqueue_refusals_total"} <= exported_names(
        QueueCollector(lambda buckets: pytest.fail("read"))
    )


# Every metric issue 5 asks for: (type as OpenMetrics exposes it, label names).
CATALOGUE = {
    "evq_content_redacted": ("counter", set()),
    "evq_serve_refused": ("counter", {"reason"}),
    "evq_steps": ("gauge", {"status"}),
    "evq_unknown_oldest_age_seconds": ("gauge", set()),
    "evq_unknown_age_seconds": ("gaugehistogram", set()),
    "evq_pending_oldest_age_seconds": ("gauge", set()),
    "evq_in_flight_expired": ("gauge", set()),
    "evq_collector_up": ("gauge", set()),
    "evq_collector_duration_seconds": ("gauge", set()),
    "evq_enqueued": ("counter", set()),
    "evq_validation_errors": ("counter", {"reason"}),
    "evq_send_attempts": ("counter", {"provider", "outcome"}),
    "evq_send_duration_seconds": ("histogram", {"provider", "outcome"}),
    "evq_decision_to_enqueue_seconds": ("histogram", set()),
    "evq_action_to_evidence_seconds": ("histogram", set()),
    "evq_rescued": ("counter", {"to"}),
    "evq_reconciled": ("counter", {"result"}),
    "evq_resolutions": ("counter", {"as"}),
    "evq_fence_rejections": ("counter", set()),
    # Issue 17, the held lifecycle.
    "evq_held_oldest_age_seconds": ("gauge", set()),
    "evq_held_decisions": ("counter", {"decision"}),
    # Issue 12, providers' rate limits.
    "evq_rate_limited": ("counter", {"provider", "reason"}),
    "evq_provider_pauses": ("counter", {"provider"}),
    "evq_provider_paused_until_timestamp_seconds": ("gauge", {"provider"}),
}


def test_every_metric_of_the_catalogue_is_exported_with_its_type_and_labels():
    metrics.init_provider("smtp")
    with pytest.raises(InvalidRequest):
        validate(request(to=[]), POLICY)  # so the labelled validation counter has a series
    body, content_type = render(build_registry(QueueCollector(lambda buckets: STATS)), "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    families = {f.name: f for f in openmetrics_families(body.decode())}
    for name, (kind, labels) in CATALOGUE.items():
        family = families.get(name)
        assert family is not None, name
        assert family.type == kind, (name, family.type)
        assert family.samples and {k for s in family.samples for k in s.labels} - {"le"} == labels, name
    # Base units and suffixes: durations and ages in seconds, counters exposed with _total.
    for name, (kind, _) in CATALOGUE.items():
        if kind == "counter":
            assert all(s.name in (name + "_total", name + "_created") for s in families[name].samples), name
        assert not name.endswith(("_ms", "_milliseconds", "_minutes")), name


def test_registering_the_collector_runs_no_query():
    reads = []
    registry = build_registry(QueueCollector(lambda buckets: reads.append(buckets) or STATS))
    assert reads == []
    assert "evq_unknown_oldest_age_seconds" in exported_names(QueueCollector(lambda buckets: reads.append(1)))
    assert reads == []
    render(registry)
    assert reads == [metrics.UNKNOWN_AGE_BUCKETS]  # one read per scrape, with the catalogue's buckets


def test_a_failed_read_is_reported_not_hidden():
    def unavailable(buckets):
        raise DatabaseUnavailable("cannot reach the database: connection refused")

    page = _page(QueueCollector(unavailable))
    assert page[("evq_collector_up", ())] == 0
    # No stale or zero gauges that would read as "nothing is unknown".
    assert not any(name.startswith(("evq_steps", "evq_unknown_", "evq_pending_")) for name, _ in page)
    # The in-process counters on the same page are still there.
    assert ("evq_enqueued_total", ()) in page


def test_a_bug_in_the_reader_costs_only_the_queue_gauges():
    page = _page(QueueCollector(lambda buckets: 1 / 0))
    assert page[("evq_collector_up", ())] == 0 and ("evq_enqueued_total", ()) in page


def test_queue_gauges_can_be_turned_off_for_a_process():
    settings = Settings(metrics_queue="off")
    with metrics_registry(settings, "postgresql://nobody@127.0.0.1:1/none") as registry:
        body, _ = render(registry)
    assert b"evq_steps" not in body and b"evq_collector_up" not in body
    assert b"evq_send_attempts_total" in body


def test_labels_come_from_fixed_sets():
    metrics.init_provider("smtp")
    labels: dict[str, set[str]] = {}
    for family in REGISTRY.collect():
        if family.name.startswith("evq_"):
            for s in family.samples:
                for key, value in s.labels.items():
                    labels.setdefault(key, set()).add(value)
    assert labels["outcome"] <= set(metrics.OUTCOMES) | {"ok", "error"}
    assert labels["to"] == set(metrics.RESCUED_TO)
    assert labels["result"] == set(metrics.RECONCILE_RESULTS)
    assert labels["as"] == set(metrics.RESOLUTIONS_AS)
    rate_reasons = {
        s.labels["reason"] for family in REGISTRY.collect() if family.name == "evq_rate_limited" for s in family.samples
    }
    assert rate_reasons == set(metrics.RATE_LIMITED_REASONS)
    assert labels["state"] == set(metrics.CIRCUIT_STATES)
    # Delivery events by type (worker/delivery.py), seen once a webhook test ran in this process.
    assert labels.get("type", set()) <= set(DELIVERY_TYPES)
    assert labels["decision"] == set(metrics.HELD_DECISIONS)
    assert set(labels) <= {
        *("operation", "outcome", "provider", "reason", "to", "result", "as", "le", "state", "type", "decision")
    }


def test_validation_errors_are_counted_by_field():
    before = REGISTRY.get_sample_value("evq_validation_errors_total", {"reason": "to"}) or 0
    with pytest.raises(InvalidRequest):
        validate(request(to=["not an address"]), POLICY)
    assert REGISTRY.get_sample_value("evq_validation_errors_total", {"reason": "to"}) == before + 1


def test_a_callers_unknown_field_names_never_become_label_values():
    """Field names an outside caller makes up are counted under one fixed reason."""
    made_up = {f"x-{i}-user@example.com": 1 for i in range(3)}
    before = REGISTRY.get_sample_value("evq_validation_errors_total", {"reason": "unknown_field"}) or 0
    with pytest.raises(InvalidRequest):
        validate(request(**made_up), POLICY)
    assert REGISTRY.get_sample_value("evq_validation_errors_total", {"reason": "unknown_field"}) == before + 1
    reasons = {s.labels["reason"] for f in REGISTRY.collect() if f.name == "evq_validation_errors" for s in f.samples}
    assert "unknown_field" in reasons and not any(name in reasons for name in made_up)


def test_decision_time_after_enqueue_is_clock_skew_counted_as_zero():
    enqueued = datetime(2026, 1, 1, tzinfo=UTC)
    count = REGISTRY.get_sample_value("evq_decision_to_enqueue_seconds_count")
    zero = REGISTRY.get_sample_value("evq_decision_to_enqueue_seconds_bucket", {"le": "0.05"})
    metrics.observe_decision_to_enqueue(enqueued + timedelta(seconds=5), enqueued)
    metrics.observe_decision_to_enqueue(None, enqueued)  # no decided_at: nothing to measure
    assert REGISTRY.get_sample_value("evq_decision_to_enqueue_seconds_count") == count + 1
    assert REGISTRY.get_sample_value("evq_decision_to_enqueue_seconds_bucket", {"le": "0.05"}) == zero + 1


def test_metrics_port_must_be_a_tcp_port():
    assert Settings.load({"EVQ_METRICS_PORT": "9640"}).metrics_port == 9640
    assert Settings.load({}).metrics_port is None  # off unless asked for
    with pytest.raises(ConfigError, match="EVQ_METRICS_PORT"):
        Settings.load({"EVQ_METRICS_PORT": "70000"})
    with pytest.raises(ConfigError, match="EVQ_METRICS_QUEUE"):
        Settings.load({"EVQ_METRICS_QUEUE": "maybe"})
