"""The health gate (ops/app/health.py) for real: `evq admin health`, GET /v1/health and the MCP
tool evq_admin_health, healthy with a running worker, and unhealthy with no worker, with the
schema behind, and with the database down."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from mcp import Client

from evq.adapters.postgres.health import PostgresHealth
from evq.adapters.postgres.store import PostgresStore
from evq.ops.mcp.server import build_server
from evq.ops.settings import Settings
from tests import contract
from tests.acceptance.conftest import Evq, make_key
from tests.faults.cluster import ThrowawayCluster
from tests.support import rows, valid, wait_until, with_store
from tests.v0_2 import database_0_2
from tests.web.support import checked, serving

NAMES = ["database", "schema", "workers", "collector", "providers"]


def checks(out: dict) -> dict[str, bool]:
    assert [c["name"] for c in out["data"]["checks"]] == NAMES
    return {c["name"]: c["ok"] for c in out["data"]["checks"]}


@pytest.fixture
def worker(evq: Evq) -> Iterator[subprocess.Popen]:
    proc = evq.popen("worker", "run", EVQ_ADAPTER="null", EVQ_POLL_INTERVAL="0.2")
    try:
        yield proc
    finally:
        proc.kill()
        proc.communicate()


def test_healthy_with_a_running_worker_then_not_once_it_stops(evq: Evq, db_url, worker):
    wait_until(lambda: evq.run("admin", "health").returncode == 0, timeout=30, what="the worker's first heartbeat")
    out = evq.json("admin", "health")
    assert out["status"] == "success" and out["data"]["healthy"] is True
    assert all(checks(out).values()) and out["meta"]["failed"] == 0
    owner = rows(db_url, "SELECT owner FROM worker_heartbeats")[0]["owner"]
    assert owner in out["data"]["checks"][2]["detail"]
    human = evq.run("admin", "health")
    assert "healthy" in human.stdout and "workers" in human.stdout

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    # A worker that stops says goodbye: health does not wait out the window to notice.
    assert rows(db_url, "SELECT count(*)::int AS n FROM worker_heartbeats") == [{"n": 0}]
    out = evq.json("admin", "health", expect=6)
    assert out["status"] == "partial_failure" and out["data"]["healthy"] is False
    assert checks(out) == {"database": True, "schema": True, "workers": False, "collector": True, "providers": True}


def test_an_open_circuit_is_unhealthy(evq: Evq, db_url, worker):
    wait_until(lambda: evq.run("admin", "health").returncode == 0, timeout=30, what="the worker's first heartbeat")
    with psycopg.connect(db_url) as conn:
        conn.execute(
            "INSERT INTO provider_circuits (provider, state, reason, detail, opened_at, probe_at) "
            "VALUES ('smtp', 'open', 'tls_failed', 'x', now(), now() + interval '1 minute')"
        )
    out = evq.json("admin", "health", expect=6)
    assert checks(out)["providers"] is False and "smtp: open (tls_failed)" in out["data"]["checks"][4]["detail"]


def test_a_worker_that_sends_through_another_provider_does_not_make_it_healthy(evq: Evq, db_url, worker):
    """Steps wait for smtp; the only worker seen sends through the null adapter: nothing will go out."""
    wait_until(lambda: evq.run("admin", "health").returncode == 0, timeout=30, what="the worker's first heartbeat")
    with_store(db_url, lambda store: store.enqueue(valid(run_id="r-health", provider="smtp")))
    out = evq.json("admin", "health", expect=6)
    assert checks(out)["workers"] is False
    assert "none sends through smtp" in out["data"]["checks"][2]["detail"]


def test_no_worker_seen(evq: Evq):
    out = evq.json("admin", "health", expect=6)
    assert checks(out) == {"database": True, "schema": True, "workers": False, "collector": True, "providers": True}
    assert "no worker seen" in out["data"]["checks"][2]["detail"]


def test_the_schema_behind_exits_5(empty_db_url):
    database_0_2(empty_db_url)  # 0.2.0's schema, revision 0012_step_guard
    out = Evq(empty_db_url).json("admin", "health", expect=5)
    assert checks(out) == {"database": True, "schema": False, "workers": False, "collector": False, "providers": False}
    assert (
        "0012_step_guard" in out["data"]["checks"][1]["detail"]
        and "evq db upgrade" in out["data"]["checks"][1]["detail"]
    )
    assert out["data"]["checks"][2]["detail"].startswith("not checked")


@pytest.fixture
def cluster() -> Iterator[ThrowawayCluster]:
    server = ThrowawayCluster()
    try:
        yield server
    finally:
        server.close()


def test_the_database_down_exits_9_on_the_cli_and_503_over_http(cluster):
    key = make_key(cluster.url(), "health-admin", "admin", created_by=None)
    with serving(cluster.url()) as api:
        http = api.client(key)
        answer = http.get("/v1/health")
        assert answer.status_code == 503 and checked(answer)["data"]["checks"][0]["ok"] is True  # no worker
        cluster.stop()
        answer = http.get("/v1/health")
        body = checked(answer)
        assert answer.status_code == 503 and body["status"] == "partial_failure"
        assert checks(body) == dict.fromkeys(NAMES, False)
        assert body["data"]["checks"][0]["detail"] == "the database does not answer"  # the key is unverified
        out = Evq(cluster.url()).json("admin", "health", expect=9)
        assert checks(out) == dict.fromkeys(NAMES, False)
        assert "cannot reach the database" in out["data"]["checks"][0]["detail"]
        cluster.start()


def test_over_http_healthy_and_a_key_is_needed(evq: Evq, db_url, admin_key, worker):
    wait_until(lambda: evq.run("admin", "health").returncode == 0, timeout=30, what="the worker's first heartbeat")
    with serving(db_url) as api:
        answer = api.client(admin_key).get("/v1/health")
        assert answer.status_code == 200 and checked(answer)["data"]["healthy"] is True
        anonymous = api.client().get("/v1/health")
        assert anonymous.status_code == 401 and checked(anonymous)["error"]["code"] == "E_AUTH_FAILED"
        spec = api.client(admin_key).get("/openapi.json").json()
        assert "/v1/health" in spec["paths"]


async def test_over_mcp_it_is_the_first_tool(db_url, admin_key):
    store = await PostgresStore.open(db_url, max_size=2)
    try:
        server = build_server(
            store, Settings.load(env={}, database_url=db_url), admin_key, health=PostgresHealth(db_url)
        )
        async with Client(server) as c:
            tools = [t.name for t in (await c.list_tools()).tools]
            result = await c.call_tool("evq_admin_health", {})
    finally:
        await store.close()
    assert tools[0] == "evq_admin_health"
    body = result.structured_content
    assert body is not None and json.loads(result.content[0].text) == body and result.is_error is False
    contract.check(("admin", "health"), body)
    assert body["status"] == "partial_failure" and checks(body)["workers"] is False  # no worker runs here
