"""Prometheus config and rules: promtool validates them and runs a unit test for every alert."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import evq.worker.metrics  # noqa: F401
from evq.ops.app.metrics import QueueCollector, exported_names
from tests.promql import metric_names
from tests.support import require_binary

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "ops" / "prometheus"
RUNBOOK = (ROOT / "ops" / "runbook.md").read_text()


def _rules(name: str) -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "rules" / name).read_text())["groups"] for r in g["rules"]]


ALERTS = _rules("alerts.yml")
RECORDING = _rules("recording.yml")


def _promtool(*args: str) -> str:
    done = subprocess.run([require_binary("promtool"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_promtool_accepts_the_config_and_the_rules_it_loads():
    out = _promtool("check", "config", "ops/prometheus/prometheus.yml")
    assert "2 rule files found" in out


def test_promtool_unit_tests_pass():
    out = _promtool("test", "rules", "ops/prometheus/tests/alerts_test.yml")
    assert "SUCCESS" in out


def test_every_alert_has_a_firing_test_and_a_quiet_one():
    tests = yaml.safe_load((PROM / "tests" / "alerts_test.yml").read_text())["tests"]
    cases = [case for t in tests for case in t.get("alert_rule_test", [])]
    for alert in ALERTS:
        name = alert["alert"]
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name} never tested firing"
        assert any(c["alertname"] == name and not c["exp_alerts"] for c in cases), f"{name} never tested quiet"


def test_every_alert_explains_itself_and_links_its_runbook_section():
    anchors = {re.sub(r"[^a-z0-9-]", "", h.lower().replace(" ", "-")) for h in re.findall(r"^## (.+)$", RUNBOOK, re.M)}
    for alert in ALERTS:
        notes = alert["annotations"]
        assert notes["summary"] and notes["description"], alert["alert"]
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == "ops/runbook.md" and anchor == alert["alert"].lower() and anchor in anchors, alert["alert"]
        assert alert["labels"]["severity"] in ("page", "warning")


def test_rules_read_only_metrics_evq_exports():
    def never(buckets):
        raise AssertionError("no query")

    known = exported_names(REGISTRY, QueueCollector(never)) | {r["record"] for r in RECORDING}
    for rule in RECORDING + ALERTS:
        names = metric_names(rule["expr"])
        assert names and names <= known, (rule.get("alert") or rule.get("record"), names - known)


def test_retry_and_unknown_ratios_per_provider_come_from_the_send_counter():
    exprs = {r["record"]: " ".join(r["expr"].split()) for r in RECORDING}
    for ratio, outcome in (("retry", "retryable"), ("unknown", "unknown")):
        assert exprs[f"evq:send_{ratio}_ratio:rate5m"] == (
            f'sum by (provider) (rate(evq_send_attempts_total{{outcome="{outcome}"}}[5m]))'
            " / sum by (provider) (rate(evq_send_attempts_total[5m]))"
        )


def test_a_missing_tool_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="prometheus package"):
        require_binary("evq-no-such-tool")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        require_binary("evq-no-such-tool")


def test_ci_installs_prometheus_without_leaving_a_daemon():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "need+=(prometheus)" in ci and "need+=(pgbouncer)" in ci
    assert 'apt-get install -y -qq --no-install-recommends "${need[@]}"' in ci
    assert "policy-rc.d" in ci and "have promtool" in ci


MONITORING = ROOT / "docs" / "guides" / "monitoring.md"


def test_the_monitoring_guide_names_the_metric_for_unknown_ages_and_the_alerts_that_page():
    readme = MONITORING.read_text()
    section = readme[
        readme.index("**How long have unknown rows aged?**") : readme.index("**Which process exports what.**")
    ]
    assert "`evq_unknown_oldest_age_seconds`" in section and "`evq_unknown_age_seconds`" in section
    paging = {a["alert"] for a in ALERTS if a["labels"]["severity"] == "page"}
    assert "EvqUnknownTooOld" in paging and all(f"`{name}`" in section for name in paging)
    assert {a["alert"] for a in ALERTS if f"`{a['alert']}`" in section} - paging <= {"EvqUnknownGrowing"}
    unknown_alert = next(a for a in ALERTS if a["alert"] == "EvqUnknownTooOld")
    assert "evq_unknown_oldest_age_seconds" in unknown_alert["expr"]


def test_the_monitoring_guide_lists_every_alert_the_rules_file_holds():
    readme = MONITORING.read_text()
    listing = readme[readme.index("`rules/alerts.yml` (") :]
    listing = listing[: listing.index(")")]
    named = set(re.findall(r"`(Evq\w+)`", listing))
    assert named == {a["alert"] for a in ALERTS}
