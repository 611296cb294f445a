"""An agent with only HTTP: enqueue and follow a send; an operator closes it; every bad
request a clear 4xx with the contract's error. The real app on a loopback port, driven
by an HTTP client; every body is checked against its command's schema in docs/cli-schema."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.acceptance.conftest import make_key
from tests.support import accepted_step, prune_closed, request, rows, step_row, unknown_steps, with_store
from tests.web.support import Served, checked, serving


@pytest.fixture
def api(db_url: str) -> Iterator[Served]:
    with serving(db_url, serve_max_body=64 * 1024) as served:
        yield served


@pytest.fixture
def keys(db_url: str) -> dict[str, str]:
    return {
        "admin": make_key(db_url, "root", "admin", created_by=None),
        "agent": make_key(db_url, "bot", "agent"),
        "operator": make_key(db_url, "alice", "operator"),
    }


def make_unknown(db_url: str, n: int = 1, *, hours_ago: float = 1, **overrides) -> list:
    at = datetime.now(UTC) - timedelta(hours=hours_ago)
    return with_store(db_url, lambda store: unknown_steps(store, n, now=at, **overrides))


def test_an_agent_with_only_http_enqueues_once_and_follows_its_send(api, keys, db_url):
    agent = api.client(keys["agent"])
    sent = request(run_id="run-http", step_id="welcome")
    first = agent.post("/v1/steps", json=sent)
    assert first.status_code == 201
    step = checked(first)["data"]
    assert step["created"] is True and step["status"] == "pending"

    again = agent.post("/v1/steps", json=sent)
    assert again.status_code == 200 and checked(again)["data"] == {**step, "created": False}

    changed = agent.post("/v1/steps", json={**sent, "subject": "something else"})
    assert changed.status_code == 409
    assert checked(changed)["error"]["code"] == "E_CONFLICT"
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 1

    shown = checked(agent.get(f"/v1/steps/{step['id']}"))["data"]
    assert shown["step"]["message_id"] == step["message_id"] and "lease_token" not in shown["step"]
    assert shown["decision"]["intent"] == sent["intent"]
    trace = checked(agent.get("/v1/runs/run-http"))["data"]
    assert [e["kind"] for e in trace["events"]] == ["decision", "enqueued"]
    listed = agent.get("/v1/steps", params={"run_id": "run-http", "status": "pending"})
    assert [s["id"] for s in checked(listed)["data"]] == [step["id"]]


def test_many_requests_in_one_transaction_and_a_dry_run(api, keys, db_url):
    agent = api.client(keys["agent"])
    batch = [request(run_id="run-many"), request(run_id="run-many")]
    planned = agent.post("/v1/steps", params={"dry_run": "true"}, json=batch)
    assert planned.status_code == 200
    assert [p["action"] for p in checked(planned)["data"]["plan"]] == ["create", "create"]
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0

    made = agent.post("/v1/steps", json=batch)
    assert made.status_code == 201
    body = checked(made)
    assert body["meta"]["count"] == 2 and body["meta"]["created"] == 2
    # One bad request in a batch writes nothing.
    bad = agent.post("/v1/steps", json=[request(run_id="run-many"), {**request(), "to": []}])
    assert bad.status_code == 422 and checked(bad)["error"]["context"]["fields"][0]["field"].startswith("[1]")
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 2


def test_list_filters_and_paging_as_the_cli(api, keys, db_url):
    old = make_unknown(db_url, 2, hours_ago=3, run_id="run-a")
    make_unknown(db_url, 1, hours_ago=0.1, run_id="run-b")
    reader = api.client(keys["agent"])
    page = checked(reader.get("/v1/steps", params={"status": "unknown", "older_than": "2h", "limit": 1}))
    assert [s["id"] for s in page["data"]] == [old[0].id]
    assert page["meta"] == {**page["meta"], "count": 1, "total": 2, "limit": 1, "offset": 0}
    past_the_end = checked(reader.get("/v1/steps", params={"status": "unknown", "offset": 10}))
    assert past_the_end["data"] == [] and past_the_end["meta"]["total"] == 3
    both = checked(reader.get("/v1/steps", params=[("status", "unknown"), ("status", "pending")]))
    assert both["meta"]["total"] == 3


def test_q_finds_a_step_by_address_and_says_its_total_is_exact(api, keys, db_url):
    [bob] = make_unknown(db_url, 1, to=["Bob@Example.NET"])
    make_unknown(db_url, 1, to=["carol@example.org"])
    reader = api.client(keys["agent"])
    found = checked(reader.get("/v1/steps", params={"q": "bob@example.net"}))
    assert [s["id"] for s in found["data"]] == [bob.id]
    assert found["meta"] == {**found["meta"], "count": 1, "total": 1, "total_exact": True}
    # `search`, the command's own name, is the same; two different searches are refused.
    assert checked(reader.get("/v1/steps", params={"search": "@example.net"}))["data"] == found["data"]
    both = reader.get("/v1/steps", params={"q": "bob@example.net", "search": "carol@example.org"})
    assert both.status_code == 400 and checked(both)["error"]["context"]["fields"][0]["field"] == "q"
    too_long = reader.get("/v1/steps", params={"q": "x" * 321})
    assert too_long.status_code == 400 and checked(too_long)["error"]["context"]["fields"][0]["field"] == "q"


def test_keys_and_roles(api, keys, db_url):
    [step] = make_unknown(db_url)
    anonymous = api.client()
    for method, path in (
        ("GET", "/v1/steps"),
        ("GET", f"/v1/steps/{step.id}"),
        ("GET", "/v1/runs/run-1"),
        ("POST", "/v1/steps"),
        ("POST", f"/v1/steps/{step.id}/resolve"),
    ):
        answer = anonymous.request(method, path, json={})
        assert answer.status_code == 401, (method, path)
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert checked(answer)["error"]["code"] == "E_AUTH_FAILED"
    wrong = api.client("evq_000000000000_" + "x" * 43).get("/v1/steps")
    assert wrong.status_code == 401 and "evq_000000000000" not in wrong.text
    not_bearer = httpx.get(api.url + "/v1/steps", headers={"Authorization": f"Basic {keys['admin']}"})
    assert not_bearer.status_code == 401

    refused = api.client(keys["operator"]).post("/v1/steps", json=request())
    assert refused.status_code == 403 and checked(refused)["error"]["code"] == "E_AUTH_FAILED"
    close = {"as": "accepted", "note": "in the provider log"}
    assert api.client(keys["agent"]).post(f"/v1/steps/{step.id}/resolve", json=close).status_code == 403
    # A dry run is a read: any role.
    preview = api.client(keys["agent"]).post(f"/v1/steps/{step.id}/resolve", json={**close, "dry_run": True})
    assert preview.status_code == 200 and checked(preview)["data"]["dry_run"] is True
    assert step_row(db_url, step.id)["status"] == "unknown"

    with_store(db_url, lambda store: store.revoke_key("bot", actor="root"))
    assert api.client(keys["agent"]).get("/v1/steps").status_code == 401


def test_an_operator_closes_unknown_rows_with_an_audit_trail(api, keys, db_url):
    one, *bulk = make_unknown(db_url, 4, hours_ago=2)
    alice = api.client(keys["operator"])
    closed = alice.post(
        f"/v1/steps/{one.id}/resolve",
        json={
            "as": "accepted",
            "note": "found in the provider log",
            "reason": "found_in_provider_log",
            "provider_message_id": "q-1",
            "evidence_url": "https://logs.example/q-1",
        },
    )
    assert closed.status_code == 200
    result = checked(closed)["data"]["results"][0]
    assert result["to_status"] == "accepted" and result["outcome"] == "succeeded"
    [evidence] = rows(db_url, "SELECT * FROM evidence WHERE kind = 'operator_resolved'")
    assert evidence["actor"] == "alice" and evidence["detail"]["note"] == "found in the provider log"

    again = alice.post(f"/v1/steps/{one.id}/resolve", json={"as": "rejected", "note": "late"})
    assert again.status_code == 409 and checked(again)["error"]["context"]["status"] == "accepted"
    missing = alice.post("/v1/steps/999999/resolve", json={"as": "rejected", "note": "x"})
    assert missing.status_code == 404 and checked(missing)["error"]["code"] == "E_NOT_FOUND"

    preview = alice.post(
        "/v1/steps/resolve", json={"status": ["unknown"], "as": "rejected", "note": "outage", "dry_run": True}
    )
    assert [s["id"] for s in checked(preview)["data"]["steps"]] == [s.id for s in bulk]
    # Someone closes one of them between the preview and the close: a partial failure, shown per row.
    with_store(db_url, lambda store: store.resolve(bulk[0].id, _resolution(), actor="bob", default_max_attempts=5))
    done = alice.post(
        "/v1/steps/resolve", json={"status": ["unknown"], "as": "rejected", "note": "outage", "older_than": "1h"}
    )
    body = checked(done)
    assert done.status_code == 200 and body["status"] == "success"
    assert body["data"]["succeeded"] == 2
    # A blank filter is refused, never read as none (which would select every unknown row).
    blank = alice.post("/v1/steps/resolve", json={"status": ["unknown"], "as": "rejected", "note": "n", "search": " "})
    assert blank.status_code == 422 and "empty: give a value" in blank.text, blank.text
    assert {step_row(db_url, s.id)["status"] for s in bulk} == {"rejected"}


def _resolution():
    from evq.worker.resolution import Resolution

    return Resolution.parse("rejected", "bob was first")


def test_resolve_errors_name_the_json_fields(api, keys, db_url):
    [step] = make_unknown(db_url)
    alice = api.client(keys["operator"])
    bad = alice.post(f"/v1/steps/{step.id}/resolve", json={"as": "maybe", "note": " ", "evidence_url": "ftp://x"})
    assert bad.status_code == 422
    assert {f["field"] for f in checked(bad)["error"]["context"]["fields"]} == {"as"}
    semantic = alice.post(
        f"/v1/steps/{step.id}/resolve", json={"as": "accepted", "note": " ", "evidence_url": "ftp://x"}
    )
    assert {f["field"] for f in checked(semantic)["error"]["context"]["fields"]} == {"note", "evidence_url"}
    bulk_without_status = alice.post("/v1/steps/resolve", json={"as": "rejected", "note": "x"})
    assert bulk_without_status.status_code == 422
    assert checked(bulk_without_status)["error"]["context"]["fields"][0]["field"] == "step_id"
    older = alice.post(
        "/v1/steps/resolve", json={"status": ["unknown"], "as": "rejected", "note": "x", "older_than": "soon"}
    )
    assert checked(older)["error"]["context"]["fields"][0]["field"] == "older_than"
    assert step_row(db_url, step.id)["status"] == "unknown"


def _raw(api: Served, key: str, method: str, path: str, *, body: bytes | None = None, **headers: str) -> httpx.Response:
    return httpx.request(
        method, api.url + path, content=body, headers={"Authorization": f"Bearer {key}", **headers}, timeout=30
    )


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("what", "method", "path", "body", "headers", "status", "field"),
    [
        ("malformed JSON", "POST", "/v1/steps", b'{"run_id": ', JSON, 400, "$body"),
        ("not UTF-8", "POST", "/v1/steps", b'{"run_id": "\xff"}', JSON, 400, "$body"),
        ("NaN is not JSON", "POST", "/v1/steps", b'{"max_attempts": NaN}', JSON, 422, "max_attempts"),
        ("too deep", "POST", "/v1/steps", b"[" * 40 + b"]" * 40, JSON, 400, "$body"),
        ("far too deep", "POST", "/v1/steps", b"[" * 5_000 + b"]" * 5_000, JSON, 400, "$body"),
        (
            "wrong content type",
            "POST",
            "/v1/steps",
            b"run_id=x",
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "Content-Type",
        ),
        ("no content type", "POST", "/v1/steps", b"{}", {}, 415, "Content-Type"),
        ("too large", "POST", "/v1/steps", b'{"text": "' + b"x" * 70_000 + b'"}', JSON, 413, "$body"),
        ("unknown field", "POST", "/v1/steps", json.dumps({**request(), "bogus": 1}).encode(), JSON, 422, "bogus"),
        ("wrong type", "POST", "/v1/steps", json.dumps({**request(), "subject": 7}).encode(), JSON, 422, "subject"),
        # A JSON escape of half a UTF-16 pair: valid JSON, not text (it was a 500 in a header value).
        (
            "unpaired surrogate in a header",
            "POST",
            "/v1/steps",
            json.dumps({**request(), "headers": {"In-Reply-To": "<a\ud800@b>"}}).encode(),
            JSON,
            422,
            "headers.In-Reply-To",
        ),
        ("not an object", "POST", "/v1/steps", b'"hello"', JSON, 422, "$"),
        ("empty batch", "POST", "/v1/steps", b"[]", JSON, 422, "$"),
        (
            "unknown resolve field",
            "POST",
            "/v1/steps/1/resolve",
            b'{"as": "accepted", "note": "x", "actor": "me"}',
            JSON,
            422,
            "actor",
        ),
        (
            "wrong resolve type",
            "POST",
            "/v1/steps/1/resolve",
            b'{"as": "accepted", "note": 5, "dry_run": "yes"}',
            JSON,
            422,
            "note",
        ),
        ("bad dry_run", "POST", "/v1/steps?dry_run=perhaps", b"{}", JSON, 422, "dry_run"),
        ("bad path id", "GET", "/v1/steps/abc", None, {}, 422, "step_id"),
        ("negative path id", "GET", "/v1/steps/-1", None, {}, 422, "step_id"),
        ("huge path id", "GET", "/v1/steps/99999999999999999999999", None, {}, 422, "step_id"),
        ("unknown query parameter", "GET", "/v1/steps?statuss=unknown", None, {}, 400, "statuss"),
        ("bad status", "GET", "/v1/steps?status=lost", None, {}, 400, "status.0"),
        ("limit out of range", "GET", "/v1/steps?limit=0", None, {}, 400, "limit"),
        ("NUL in the query", "GET", "/v1/steps?run_id=a%00b", None, {}, 400, "$path"),
        ("NUL in the path", "GET", "/v1/runs/a%00b", None, {}, 400, "$path"),
        ("bad duration", "GET", "/v1/steps?older_than=forever", None, {}, 400, "older_than"),
        ("method not allowed", "DELETE", "/v1/steps", None, {}, 405, "$method"),
    ],
)
def test_every_kind_of_bad_request_is_a_clear_4xx(api, keys, db_url, what, method, path, body, headers, status, field):
    answer = _raw(api, keys["admin"], method, path, body=body, **headers)
    assert answer.status_code == status, (what, answer.text[:500])
    out = answer.json()
    assert out["status"] == "error" and out["error"]["code"] == "E_INVALID_ARG", what
    assert out["error"]["context"]["fields"][0]["field"] == field, (what, out)
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0


def test_a_chunked_body_over_the_limit_is_refused_while_it_is_read(api, keys):
    def chunks() -> Iterator[bytes]:
        yield b'{"text": "'
        for _ in range(100):
            yield b"x" * 1024
        yield b'"}'

    answer = httpx.post(
        api.url + "/v1/steps",
        content=chunks(),
        timeout=30,
        headers={"Authorization": f"Bearer {keys['admin']}", **JSON},
    )
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "E_INVALID_ARG"


def test_unknown_routes_and_reads_of_what_does_not_exist(api, keys):
    client = api.client(keys["admin"])
    assert client.get("/v2/steps").status_code == 404
    assert client.get("/v1/steps/424242").json()["error"]["code"] == "E_NOT_FOUND"
    assert client.get("/v1/runs/no-such-run").status_code == 404


def test_healthz_and_metrics_need_no_key_the_openapi_document_does(api, keys, db_url):
    make_unknown(db_url, 1, hours_ago=2)
    assert httpx.get(api.url + "/healthz").text == "ok\n"
    metrics = httpx.get(api.url + "/metrics").text
    assert 'evq_steps{status="unknown"} 1.0' in metrics and "evq_collector_up 1.0" in metrics
    anonymous = httpx.get(api.url + "/openapi.json")
    assert anonymous.status_code == 401 and checked(anonymous)["error"]["code"] == "E_AUTH_FAILED"
    doc = api.client(keys["agent"]).get("/openapi.json").json()
    assert set(doc["paths"]) == {
        "/v1/health",
        "/v1/steps",
        "/v1/steps/{step_id}",
        "/v1/runs/{run_id}",
        "/v1/steps/{step_id}/resolve",
        "/v1/steps/{step_id}/approve",
        "/v1/steps/{step_id}/deny",
        "/v1/steps/{step_id}/cancel",
        "/v1/steps/resolve",
        "/v1/providers",
        "/v1/policy",
        "/v1/refusals",
        "/v1/events",
        "/v1/deliveries",
        "/v1/webhooks/{provider}",
    }
    # Each operation is named after its command (ops/app/commands/): `evq steps enqueue` is steps.enqueue.
    assert doc["paths"]["/v1/steps"]["post"]["operationId"] == "steps.enqueue"
    assert doc["paths"]["/v1/steps/resolve"]["post"]["operationId"] == "steps.resolve"
    assert doc["paths"]["/v1/steps/{step_id}/resolve"]["post"]["x-evq-command"] == "steps.resolve"
    assert doc["paths"]["/v1/steps"]["post"]["security"] == [{"bearer": []}]
    created = doc["paths"]["/v1/steps"]["post"]["responses"]["201"]["content"]["application/json"]["schema"]
    assert created == {"$ref": "#/components/schemas/steps_enqueue_response"}
    body = doc["paths"]["/v1/steps"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["anyOf"][0]["additionalProperties"] is False


# Reachable without a key on purpose: probes, and what a browser needs to sign in at all.
OPEN = {("GET", "/healthz"), ("GET", "/metrics"), ("GET", "/"), ("GET", "/ops/login"), ("GET", "/ops/static/ops.css")}
OPEN |= {("GET", "/ops/static/{name}.js")}  # the page's optional script (ops/web/page/assets.py)
# The providers' webhooks carry no key: the request's signature is their authentication (tests/web/test_webhooks.py).
OPEN |= {("POST", "/v1/webhooks/{provider}")}


def test_every_route_but_healthz_and_metrics_needs_a_key(api, keys, db_url):
    """Every route the app has (not a list kept by hand): without a key /v1 and /openapi.json
    answer 401, the page sends the visitor to its sign-in (or refuses a POST that carries no
    CSRF token); nothing is changed."""
    from fastapi.routing import APIRoute

    [step] = make_unknown(db_url)

    def flat(routes):  # an included router is one entry holding its own routes
        for route in routes:
            inner = getattr(route, "original_router", None)
            yield from flat(inner.routes) if inner is not None else [route]

    routes = [
        (method, route.path)
        for route in flat(api.server.config.app.app.routes)
        if isinstance(route, APIRoute)
        for method in sorted(route.methods)
    ]
    assert ("POST", "/v1/steps/resolve") in routes and ("POST", "/ops/unknown/close") in routes
    anonymous = api.client(follow_redirects=False)
    for method, path in routes:
        if (method, path) in OPEN:
            continue
        url = re.sub(r"\{[a-z_]+\}", str(step.id), path)
        answer = anonymous.request(method, url, **({"json": {}} if path.startswith("/v1") and method == "POST" else {}))
        if path.startswith("/ops"):
            to_sign_in = answer.status_code == 303 and answer.headers["location"] == "/ops/login"
            no_csrf = method == "POST" and answer.status_code == 403 and "CSRF" in answer.text
            assert to_sign_in or no_csrf, (method, path, answer.status_code)
        else:
            assert answer.status_code == 401, (method, path, answer.status_code)
            assert checked(answer)["error"]["code"] == "E_AUTH_FAILED"
    assert step_row(db_url, step.id)["status"] == "unknown"
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 1


def test_the_api_binds_loopback_by_default():
    from evq.ops.settings import Settings

    assert Settings.load(env={}).serve_host == "127.0.0.1"


def test_a_read_only_database_is_a_clear_503_and_nothing_is_written(db_url, keys):
    """Failure matrix row 8 over HTTP: enqueue and resolve answer 503 E_DB_UNAVAILABLE saying the
    database is read-only (never a 500), reads still work, and nothing is written."""
    from tests.faults.test_database_faults import read_only

    [step] = make_unknown(db_url)
    read_only(db_url, True)
    try:
        with serving(db_url) as api:
            refused = api.client(keys["agent"]).post("/v1/steps", json=request())
            closed = api.client(keys["operator"]).post(
                f"/v1/steps/{step.id}/resolve", json={"as": "accepted", "note": "seen"}
            )
            listed = api.client(keys["agent"]).get("/v1/steps")
    finally:
        read_only(db_url, False)
    for answer in (refused, closed):
        assert answer.status_code == 503, answer.text[:500]
        error = checked(answer)["error"]
        assert error["code"] == "E_DB_UNAVAILABLE" and "read-only" in error["message"]
    assert listed.status_code == 200 and [s["id"] for s in checked(listed)["data"]] == [step.id]
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 1}]
    assert step_row(db_url, step.id)["status"] == "unknown"


def test_a_refused_enqueue_is_recorded_with_its_key_counted_and_shown(db_url, keys):
    """EVQ_REQUIRE_PROVENANCE refuses a request without model and instruction version; the
    refusal is recorded (the key's name, every field, what was asked, never the body), read
    back at GET /v1/refusals and on the ops page, and counted by the collector's scrape."""
    with serving(db_url, require_provenance=("model", "instruction_version")) as served:
        agent = served.client(keys["agent"])
        secret_body = "the body that must not be kept"
        sent = request(run_id="run-refused", step_id="no-provenance", text=secret_body, decision=None)
        refused = agent.post("/v1/steps", json=sent)
        assert refused.status_code == 422
        fields = [f["field"] for f in checked(refused)["error"]["context"]["fields"]]
        assert fields == ["decision.model", "decision.instruction_version"]
        assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
        ok = agent.post("/v1/steps", json={**sent, "decision": {"model": "m-1", "instruction_version": "v1"}})
        assert ok.status_code == 201

        listed = checked(agent.get("/v1/refusals"))
        [row] = listed["data"]
        assert (row["interface"], row["key_name"], row["dry_run"], row["requests"]) == ("http", "bot", False, 1)
        assert [e["field"] for e in row["errors"]] == fields and row["reasons"] == ["decision"]
        assert row["asked"][0]["run_id"] == "run-refused" and row["asked"][0]["recipients"] == 1
        stored = json.dumps(rows(db_url, "SELECT * FROM enqueue_refusals"), default=str)
        assert secret_body not in stored and sent["to"][0] not in stored and keys["agent"] not in stored
        assert checked(agent.get("/v1/refusals", params={"interface": "mcp"}))["data"] == []
        assert (
            agent.get("/v1/refusals", params={"interface": "smtp"}).status_code == 400
        )  # a value the query cannot read

        scraped = httpx.get(served.url + "/metrics").text
        assert 'evq_enqueue_refusals_total{field="decision",interface="http"} 1.0' in scraped
        assert 'evq_pending_age_seconds_bucket{le="+Inf"} 1.0' in scraped

        with httpx.Client(base_url=served.url, timeout=30) as web:
            login = web.get("/ops/login")
            token = re.search(r'name="csrf" value="([^"]+)"', login.text)
            assert token
            signed = web.post("/ops/login", data={"csrf": token[1], "key": keys["operator"]})
            assert signed.status_code == 303
            overview = web.get("/ops").text
        assert f'id="refusal-{row["id"]}"' in overview and "decision.model" in overview


def test_a_key_pruned_since_is_answered_over_http_as_its_step_ended(api, keys, db_url):
    """After evq prune, the agent's retry over HTTP (and its dry run) gets the step as it ended,
    marked pruned, and nothing new; its id answers 404 saying it was pruned."""
    sent = request(run_id="run-http", step_id="pruned")
    a_month_ago = datetime.now(UTC) - timedelta(days=30)
    first = with_store(db_url, lambda store: accepted_step(store, sent, now=a_month_ago))
    assert prune_closed(db_url) == 1
    agent = api.client(keys["agent"])

    again = agent.post("/v1/steps", json=sent)
    assert again.status_code == 200 and rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
    data = checked(again)["data"]
    assert (data["id"], data["message_id"], data["created"]) == (first.id, first.message_id, False)
    assert (data["status"], data["pruned"], data["next_action"]) == ("accepted", True, "none")
    [plan] = checked(agent.post("/v1/steps", params={"dry_run": "true"}, json=sent))["data"]["plan"]
    assert (plan["action"], plan["existing_id"], plan["pruned"], plan["next_action"]) == (
        "return_existing",
        first.id,
        True,
        "none",
    )
    changed = agent.post("/v1/steps", json={**sent, "subject": "something else"})
    assert changed.status_code == 409 and checked(changed)["error"]["context"]["pruned"] is True
    gone = agent.get(f"/v1/steps/{first.id}")
    assert gone.status_code == 404
    error = checked(gone)["error"]
    assert (error["code"], error["context"]["pruned"], error["context"]["status"]) == ("E_NOT_FOUND", True, "accepted")
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
