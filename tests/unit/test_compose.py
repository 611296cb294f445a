"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_orders_postgres_migrate_worker():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert "healthcheck" in services["postgres"]
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["worker"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["worker"]["environment"]["EVQ_DATABASE_URL"].startswith("postgresql://")
    # The image carries every top-level package the console script imports.
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("worker", "adapters", "migrations", "ops"):
        assert f"COPY {package} ./{package}" in dockerfile
