"""The end-to-end proof that the dashboard's numbers exist: a real Prometheus (Debian's
package) scrapes a running `evq worker run`, evaluates evq's rules, and answers PromQL
with the age of the oldest unknown row."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from evq.adapters.postgres.enqueue import enqueue_own
from evq.worker.errors import InvalidRequest
from tests.support import POLICY, execute, free_port, request, require_binary, spawn, stop

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "ops" / "prometheus" / "rules"
TWO_HOURS = 7200


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait_for(what: str, probe: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # not listening yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}; last answer: {last!r}")


@contextmanager
def _running(
    argv: list[str], *, log: Path, ready: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """A process started with its output in ``log``, once ``ready`` answers 200; stopped afterwards."""
    with open(log, "w") as out:
        process = spawn(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(ready, lambda: urllib.request.urlopen(ready, timeout=2).close() or True)
        yield process
    finally:
        stop(process)


@pytest.fixture
def worker_metrics(evq, db_url, tmp_path) -> Iterator[str]:
    """A running `evq worker run` with /metrics on a free loopback port; its address."""
    address = f"127.0.0.1:{free_port()}"
    host, port = address.split(":")
    argv = evq.cmd("worker", "run", "--adapter", "null", "--metrics-port", port)
    # /metrics listens on EVQ_SERVE_HOST's address.
    with _running(
        argv, env={**evq.env, "EVQ_SERVE_HOST": host}, log=tmp_path / "worker.log", ready=f"http://{address}/healthz"
    ) as process:
        yield address
    assert process.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]


@pytest.fixture
def prometheus(worker_metrics, tmp_path) -> Iterator[str]:
    """A real Prometheus on a free loopback port, scraping the worker every second with evq's rules."""
    binary = require_binary("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "recording.yml"), str(RULES / "alerts.yml")],
        "scrape_configs": [{"job_name": "evq", "static_configs": [{"targets": [worker_metrics]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    argv = [
        binary,
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address={url.removeprefix('http://')}",
        "--log.level=warn",
    ]
    with _running(argv, log=tmp_path / "prometheus.log", ready=f"{url}/-/ready"):
        yield url


def _query(prometheus: str, promql: str) -> list[dict]:
    answer = _get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@pytest.fixture
def unknown_for_two_hours(db_url) -> int:
    step = enqueue_own(db_url, request(), policy=POLICY)
    execute(
        db_url,
        "UPDATE email_steps SET status = 'unknown', attempts = 1, first_attempt_at = now(), "
        "unknown_since = now() - make_interval(secs => %s) WHERE id = %s",
        (TWO_HOURS, step.id),
    )
    return step.id


@pytest.mark.slow
def test_prometheus_scrapes_the_worker_and_knows_how_long_unknown_rows_have_aged(unknown_for_two_hours, prometheus):
    [series] = _wait_for("a scrape", lambda: _query(prometheus, "evq_unknown_oldest_age_seconds"))
    assert series["metric"]["job"] == "evq"
    assert TWO_HOURS <= float(series["value"][1]) < TWO_HOURS + 120
    [unknown] = _query(prometheus, 'evq_steps{status="unknown"}')
    assert float(unknown["value"][1]) == 1
    # The age distribution the dashboard draws: a little over two hours old.
    buckets = {s["metric"]["le"]: float(s["value"][1]) for s in _query(prometheus, "evq_unknown_age_seconds_bucket")}
    assert buckets["7200.0"] == 0 and buckets["14400.0"] == 1 and buckets["+Inf"] == 1

    # evq's recording rules run in this real server too, and the alert that pages sees the row.
    [recorded] = _wait_for("the recording rule", lambda: _query(prometheus, "evq:unknown_oldest_age_seconds:max"))
    assert TWO_HOURS <= float(recorded["value"][1]) < TWO_HOURS + 120

    def too_old() -> list[dict]:
        alerts = _get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "EvqUnknownTooOld"]

    [alert] = _wait_for("EvqUnknownTooOld to be pending", too_old)
    assert alert["state"] in ("pending", "firing") and alert["labels"]["severity"] == "page"
    assert alert["annotations"]["runbook_url"] == "ops/runbook.md#evqunknowntooold"
    rules = _get(f"{prometheus}/api/v1/rules")["data"]["groups"]
    assert all(rule["health"] == "ok" for group in rules for rule in group["rules"]), rules


def test_worker_refuses_a_busy_metrics_port_with_a_clear_error(evq):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        out = evq.json("worker", "run", "--metrics-port", port, expect=2, EVQ_SERVE_HOST="127.0.0.1")
    assert out["error"]["code"] == "E_INVALID_ARG"
    assert "EVQ_METRICS_PORT" in out["error"]["message"] and port in out["error"]["message"]


@pytest.fixture
def refused_in_this_process(db_url) -> None:
    """An agent's own Python process (this one, not the worker) has one enqueue refused."""
    with pytest.raises(InvalidRequest):
        enqueue_own(db_url, request(decision=None), policy=replace(POLICY, require_provenance=("model",)))


@pytest.mark.slow
def test_prometheus_sees_a_refusal_made_in_another_process_through_the_workers_collector(
    refused_in_this_process, prometheus
):
    [series] = _wait_for("a scrape", lambda: _query(prometheus, "evq_enqueue_refusals_total"))
    assert series["metric"]["interface"] == "python" and series["metric"]["field"] == "decision"
    assert float(series["value"][1]) == 1
    # The worker never validated anything: its own per-process counter has no refusal.
    assert _query(prometheus, "sum(evq_validation_errors_total) > 0") == []
    pending = {s["metric"]["le"]: float(s["value"][1]) for s in _query(prometheus, "evq_pending_age_seconds_bucket")}
    assert pending["+Inf"] == 0
