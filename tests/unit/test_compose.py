"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import yaml
from jsonschema import Draft201909Validator

ROOT = Path(__file__).resolve().parents[2]
# The Compose Specification's JSON Schema as docker-compose 1.29.2 ships it
# (compose/config/compose_spec.json in its wheel, Apache License 2.0), kept beside this test.
COMPOSE_SPEC = json.loads((Path(__file__).with_name("compose_spec.json")).read_text())


def test_compose_file_follows_the_compose_specification():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    validator = Draft201909Validator(COMPOSE_SPEC)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []
    # The schema is strict enough to catch a misspelt key or condition.
    typo = copy.deepcopy(compose)
    typo["services"]["worker"]["depends_on"]["migrate"]["condition"] = "service_finished"
    typo["services"]["grafana"]["volume"] = typo["services"]["grafana"].pop("volumes")
    assert len(list(validator.iter_errors(typo))) == 2


def test_compose_orders_postgres_migrate_worker():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "migrate", "worker", "ops", "smtp-sink", "prometheus", "grafana"}
    # The workers send to the local SMTP sink, on the port it listens on.
    sink = services["smtp-sink"]["entrypoint"]
    assert sink[:3] == ["python", "-m", "evq.ops.dev.smtp"]
    assert services["worker"]["environment"]["EVQ_SMTP_HOST"] == "smtp-sink"
    assert services["worker"]["environment"]["EVQ_SMTP_PORT"] == sink[sink.index("--port") + 1]
    assert services["worker"]["depends_on"]["smtp-sink"]["condition"] == "service_started"
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["environment"]["EVQ_DATABASE_URL"].startswith("postgresql://")
    ops = services["ops"]
    assert (
        ops["command"][0] == "serve" and ops["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    )
    assert ops["ports"] == ["127.0.0.1:8080:8080"]  # the API and the page reach the host's loopback only
    # The image carries every top-level package the console script imports.
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("worker", "adapters", "migrations", "ops"):
        assert f"COPY {package} ./{package}" in dockerfile


def test_compose_prometheus_scrapes_the_workers_and_loads_the_rules():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    worker_env = services["worker"]["environment"]
    assert worker_env["EVQ_SERVE_HOST"] == "0.0.0.0"  # /metrics listens there: scraped from another container
    prometheus = services["prometheus"]
    assert "./ops/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((ROOT / "ops" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"evq", "evq-ops"}
    [sd] = jobs["evq"]["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["port"] == int(worker_env["EVQ_METRICS_PORT"])
    # The ops server counts what happens in it (API enqueues, operators' verdicts): scraped too,
    # at the port it serves on, without exporting the queue gauges a second time.
    ops = services["ops"]
    [static] = jobs["evq-ops"]["static_configs"]
    assert static["targets"] == [f"ops:{ops['command'][ops['command'].index('--port') + 1]}"]
    assert jobs["evq-ops"].get("metrics_path", "/metrics") == "/metrics"
    assert ops["environment"]["EVQ_METRICS_QUEUE"] == "off"
    # The rule files it names exist next to it, where the mount puts them.
    for rule_file in config["rule_files"]:
        assert (ROOT / "ops" / "prometheus" / rule_file).is_file()
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_started"
    # Every service either builds the evq image or names a pinned image.
    for name, service in services.items():
        assert "build" in service or re.fullmatch(r"[\w./-]+:[\w.-]+", service["image"]), name
