"""The Grafana dashboard loads by itself and every query names a metric evq really exports."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import evq.worker.metrics  # noqa: F401  (the in-process catalogue registers itself)
from evq.ops.app.metrics import QueueCollector, exported_names
from tests.promql import metric_names

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "ops" / "grafana"
DASHBOARD = json.loads((GRAFANA / "dashboards" / "evq.json").read_text())


def _exported() -> set[str]:
    def never(buckets):
        raise AssertionError("describing the collector must not read the database")

    return exported_names(REGISTRY, QueueCollector(never))


def _targets():
    for panel in DASHBOARD["panels"]:
        for target in panel["targets"]:
            yield panel, target


def test_every_panel_query_names_only_exported_metrics():
    exported = _exported()
    for panel, target in _targets():
        names = metric_names(target["expr"])
        assert names, (panel["title"], target["expr"])
        assert names <= exported, (panel["title"], names - exported)


def test_the_metric_name_reader_is_not_fooled_by_functions_labels_or_ranges():
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, provider) (rate(evq_send_duration_seconds_bucket{outcome="x"}[$__rate_interval])))'
    ) == {"evq_send_duration_seconds_bucket"}
    assert metric_names("(max(evq_collector_up) or vector(0)) < 1e3") == {"evq_collector_up"}
    assert metric_names("sum(rate(a_total[5m])) by (le) / b offset 5m") == {"a_total", "b"}
    assert "evq_nonexistent" not in _exported()


def test_dashboard_answers_the_operators_questions():
    exprs = " ".join(t["expr"] for _, t in _targets())
    for metric in (
        'evq_steps{status="unknown"}',  # how many are unknown
        "evq_unknown_oldest_age_seconds",  # how long the oldest has waited
        "evq_unknown_age_seconds_bucket",  # the age distribution
        "evq_pending_oldest_age_seconds",  # queue lag
        'evq_send_attempts_total{outcome="retryable"}',  # retry ratio
        'evq_send_attempts_total{outcome="unknown"}',  # unknown ratio
        "evq_send_duration_seconds_bucket",  # latency quantiles
        "evq_enqueue_refusals_total",  # what agents were refused, from every process
        "evq_evidence_partitions_ahead",  # retention's partitions made ahead of the steps
        "evq_evidence_overflow_rows",  # evidence none of them covered
    ):
        assert metric in exprs, metric
    assert any("sum by (outcome)" in t["expr"] for _, t in _targets())  # throughput by outcome


def test_dashboard_is_classic_json_with_a_fixed_uid_and_a_datasource_variable():
    assert DASHBOARD["uid"] == "evq-overview"
    [variable] = [v for v in DASHBOARD["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    ref = "${" + variable["name"] + "}"
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel, target in _targets():
        assert panel["datasource"]["uid"] == ref and target["datasource"]["uid"] == ref, panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24


def test_provisioning_loads_the_dashboard_and_the_datasource():
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "evq.yml").read_text())
    [provider] = providers["providers"]
    sources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    [source] = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    # docker-compose.yml mounts the dashboards folder where the provider looks.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./ops/grafana/dashboards:{provider['options']['path']}:ro" in mounts
    assert "./ops/grafana/provisioning:/etc/grafana/provisioning:ro" in mounts
