"""Provider profiles on every interface (docs/design.md, "Provider profiles"): `evq providers
list` (CLI, HTTP, MCP, the ops page) shows each provider's profile, rate limit and circuit; an
enqueue through a provider that could never settle a lost answer says so, and with
EVQ_REFUSE_UNRESOLVABLE is refused (E_UNRESOLVABLE, exit 2, HTTP 422), recorded as a refusal;
the Python API does the same given the settings' policy. Every output is checked against its
command's schema (tests/contract.py)."""

from __future__ import annotations

import json
import re

import httpx
import psycopg
import pytest

import evq as evq_api
from evq.ops.settings import Settings
from tests.acceptance.conftest import Evq, make_key
from tests.support import request, rows
from tests.web.support import checked, serving

PROFILE_ENV = {
    "EVQ_ADAPTER": "smtp,http",
    "EVQ_HTTP_API_KEY": "re_not_a_real_key",
    "EVQ_RATE_LIMIT": "http=2/s:5,smtp=120/min",
    "EVQ_HTTP_DEDUPE_WINDOW": "3600",
}


def steps(db_url: str) -> int:
    return rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"]


def test_providers_list_shows_each_profile_rate_limit_and_circuit(db_url):
    listed = Evq(db_url, **PROFILE_ENV).json("providers", "list")
    by = {p["provider"]: p for p in listed["data"]}
    assert list(by) == ["smtp", "http", "ses", "null"]
    assert by["http"]["profile"] == {
        "dedupe_window_seconds": 3600,
        "lookup_by": ["key_tag"],
        "webhook_events": [],
        "resolvable": True,
    }
    assert by["smtp"]["profile"] == {
        "dedupe_window_seconds": None,
        "lookup_by": [],
        "webhook_events": [],
        "resolvable": False,
    }
    assert by["null"]["profile"]["resolvable"] is False and by["ses"]["profile"]["resolvable"] is False
    assert by["http"]["rate_limit"] == {"per_second": 2.0, "burst": 5, "setting": "http=2/s:5"}
    assert by["smtp"]["rate_limit"] == {"per_second": 2.0, "burst": 2, "setting": "smtp=2/s:2"}
    assert by["null"]["rate_limit"] is None
    assert (by["smtp"]["configured"], by["http"]["configured"], by["null"]["configured"]) == (True, True, False)
    assert all(p["state"] == "closed" and p["sending"] for p in listed["data"])  # health: the circuit, as before
    assert listed["meta"]["unresolvable"] == 3 and listed["meta"]["held"] == 0

    human = Evq(db_url, **PROFILE_ENV).run("providers", "list")
    assert human.returncode == 0, human.stderr
    line = {row.split()[0]: row for row in human.stdout.splitlines()[1:]}
    assert "NOTHING: unresolvable" in line["smtp"] and "2/s:5" in line["http"]
    assert "dedupe 3600s" in line["http"] and "lookup by key_tag" in line["http"]
    assert "not in EVQ_ADAPTER" in line["null"]


def test_the_cli_flags_an_unresolvable_send_and_with_the_setting_refuses_and_records_it(db_url, admin_key):
    cli = Evq(db_url, api_key=admin_key, **PROFILE_ENV)
    plan = cli.json("steps", "enqueue", "--file", "-", "--dry-run", input=json.dumps(request(step_id="plan")))
    [item] = plan["data"]["plan"]
    assert item["ambiguity"] == "unresolvable" and "operator" in item["ambiguity_hint"]
    via_http = cli.json("steps", "enqueue", "--file", "-", input=json.dumps(request(step_id="h", provider="http")))
    assert via_http["data"]["ambiguity"] is None and via_http["data"]["ambiguity_hint"] is None
    flagged = cli.run("steps", "enqueue", "--file", "-", input=json.dumps(request(step_id="s")))
    assert flagged.returncode == 0 and "warning: 1 of 1 unresolvable" in flagged.stdout
    assert steps(db_url) == 2

    refusing = {**PROFILE_ENV, "EVQ_REFUSE_UNRESOLVABLE": "on"}
    batch = "\n".join(json.dumps(request(step_id=s, provider=p)) for s, p in [("a", "http"), ("b", "smtp")])
    out = cli.json("steps", "enqueue", "--file", "-", input=batch, expect=2, **refusing)
    assert out["error"]["code"] == "E_UNRESOLVABLE"
    assert [f["field"] for f in out["error"]["context"]["fields"]] == ["[1].provider"]
    assert steps(db_url) == 2  # nothing of the batch was written
    dry = cli.json("steps", "enqueue", "--file", "-", "--dry-run", input=json.dumps(request()), expect=2, **refusing)
    assert dry["error"]["code"] == "E_UNRESOLVABLE"
    human = cli.run("steps", "enqueue", "--file", "-", input=json.dumps(request(step_id="c")), **refusing)
    assert human.returncode == 2 and "EVQ_REFUSE_UNRESOLVABLE" in human.stderr

    recorded = cli.json("refusals", "list", "--interface", "cli")["data"]
    assert len(recorded) == 3 and all(r["reasons"] == ["provider"] for r in recorded)
    assert [r["dry_run"] for r in recorded] == [False, True, False]  # newest first


def test_http_api_and_ops_page_show_profiles_flag_and_refuse(db_url):
    agent = make_key(db_url, "bot", "agent")
    operator = make_key(db_url, "alice", "operator")
    with serving(db_url, rate_limit=Settings.load(env=PROFILE_ENV).rate_limit) as served:
        client = served.client(agent)
        listed = checked(client.get("/v1/providers"))
        assert {p["provider"]: p["profile"]["resolvable"] for p in listed["data"]} == {
            "smtp": False,
            "http": True,
            "ses": False,
            "null": False,
        }
        sent = checked(client.post("/v1/steps", json=request(run_id="run-p", step_id="s")))["data"]
        assert sent["ambiguity"] == "unresolvable" and sent["created"] is True
        many = checked(client.post("/v1/steps", json=[request(provider="http"), request(provider="null")]))
        assert [s["ambiguity"] for s in many["data"]] == [None, "unresolvable"]
        with httpx.Client(base_url=served.url, timeout=30) as web:
            token = re.search(r'name="csrf" value="([^"]+)"', web.get("/ops/login").text)
            assert token
            assert web.post("/ops/login", data={"csrf": token[1], "key": operator}).status_code == 303
            overview = web.get("/ops").text
        smtp_row = re.search(r'<tr id="provider-smtp">.*?</tr>', overview, re.S)
        http_row = re.search(r'<tr id="provider-http">.*?</tr>', overview, re.S)
        assert smtp_row and "unresolvable" in smtp_row[0]
        assert http_row and "lookup by key_tag" in http_row[0] and "2/s, burst 5" in http_row[0]

    with serving(db_url, refuse_unresolvable=True) as served:
        client = served.client(agent)
        refused = client.post("/v1/steps", json=request(run_id="run-p", step_id="refused"))
        assert refused.status_code == 422
        error = checked(refused)["error"]
        assert error["code"] == "E_UNRESOLVABLE" and error["context"]["fields"][0]["field"] == "provider"
        assert client.post("/v1/steps", json=request(provider="http")).status_code == 201
        [row] = checked(client.get("/v1/refusals"))["data"]
        assert (row["interface"], row["key_name"], row["reasons"]) == ("http", "bot", ["provider"])


async def test_mcp_flags_and_refuses_the_same(db_url):
    from tests.web.test_mcp import call, client, key

    agent = await key(db_url, "bot", "agent", created_by="test")
    async with client(db_url, agent) as c:
        sent = await call(c, "evq_steps_enqueue", request(step_id="m"), "steps.enqueue")
        assert sent["data"]["ambiguity"] == "unresolvable"
        listed = await call(c, "evq_providers_list", {}, "providers.list")
        assert listed["meta"]["unresolvable"] == 3
    async with client(db_url, agent, refuse_unresolvable=True) as c:
        refused = await call(c, "evq_steps_enqueue", request(step_id="m2"), "steps.enqueue")
        assert refused["error"]["code"] == "E_UNRESOLVABLE"
        dry = await call(c, "evq_steps_enqueue", {**request(step_id="m3"), "dry_run": True}, "steps.enqueue")
        assert dry["error"]["code"] == "E_UNRESOLVABLE"
        ok = await call(c, "evq_steps_enqueue", request(step_id="m4", provider="http"), "steps.enqueue")
        assert ok["data"]["ambiguity"] is None
    assert [r["interface"] for r in rows(db_url, "SELECT interface FROM enqueue_refusals")] == ["mcp", "mcp"]


def test_the_python_api_given_the_settings_policy_flags_and_refuses(db_url):
    policy = Settings.load(env={}).policy()
    with psycopg.connect(db_url, autocommit=True) as conn:
        flagged = evq_api.enqueue(conn, request(step_id="py-1"), policy=policy)
        assert flagged.ambiguity == "unresolvable" and flagged.to_dict()["ambiguity_hint"]
        assert evq_api.enqueue(conn, request(step_id="py-2"), policy=evq_api.Policy()).ambiguity is None
        [a, b] = evq_api.enqueue_many(
            conn, [request(step_id="py-3", provider="http"), request(step_id="py-4")], policy=policy
        )
        assert (a.ambiguity, b.ambiguity) == (None, "unresolvable")
        refusing = Settings.load(env={"EVQ_REFUSE_UNRESOLVABLE": "true"}).policy()
        with pytest.raises(evq_api.Unresolvable):
            evq_api.enqueue(conn, request(step_id="py-5"), policy=refusing)
    assert steps(db_url) == 4
    with pytest.raises(evq_api.Unresolvable) as refused:
        evq_api.enqueue_own(db_url, request(step_id="py-6"), policy=refusing)
    assert refused.value.code == "E_UNRESOLVABLE" and steps(db_url) == 4
    [row] = rows(db_url, "SELECT interface, reasons FROM enqueue_refusals")
    assert (row["interface"], list(row["reasons"])) == ("python", ["provider"])


def test_a_replay_under_the_refusal_answers_the_stored_step_and_another_provider_is_a_conflict(db_url, admin_key):
    """Issue 16's review finding, through the CLI: a step enqueued through smtp with the refusal
    off, then replayed with EVQ_REFUSE_UNRESOLVABLE=on, is answered as it is (never "nothing was
    enqueued" for a row that will be sent); following the hint with --provider http is refused
    as another send, on the dry run too, and the row stays smtp."""
    cli = Evq(db_url, api_key=admin_key, **PROFILE_ENV)
    refusing = {**PROFILE_ENV, "EVQ_REFUSE_UNRESOLVABLE": "on"}
    asked = request(run_id="run-16", step_id="s")
    first = cli.json("steps", "enqueue", "--file", "-", input=json.dumps(asked))["data"]
    assert first["created"] is True and first["ambiguity"] == "unresolvable"

    again = cli.json("steps", "enqueue", "--file", "-", input=json.dumps(asked), **refusing)["data"]
    assert (again["id"], again["created"], again["status"]) == (first["id"], False, "pending")
    assert again["ambiguity"] == "unresolvable"  # its provider's flag: smtp could never settle it
    [plan] = cli.json("steps", "enqueue", "--file", "-", "--dry-run", input=json.dumps(asked), **refusing)["data"][
        "plan"
    ]
    assert (plan["action"], plan["existing_id"], plan["ambiguity"]) == ("return_existing", first["id"], "unresolvable")

    via_http = json.dumps({**asked, "provider": "http"})
    for env in (PROFILE_ENV, refusing):
        out = cli.json("steps", "enqueue", "--file", "-", input=via_http, expect=3, **env)
        assert out["error"]["code"] == "E_CONFLICT"
        assert out["error"]["message"].startswith("this key was enqueued through smtp;")
        assert out["error"]["context"]["existing_provider"] == "smtp"
        [dry] = cli.json("steps", "enqueue", "--file", "-", "--dry-run", input=via_http, **env)["data"]["plan"]
        assert (dry["action"], dry["existing_id"]) == ("refuse_conflict", first["id"])
    [row] = rows(db_url, "SELECT id, provider, status FROM steps_now")
    assert (row["id"], row["provider"], row["status"]) == (first["id"], "smtp", "pending")

    # A batch mixing the stored step with new ones: only a new unresolvable one is refused ...
    new_smtp = request(run_id="run-16", step_id="new-smtp")
    batch = "\n".join(json.dumps(r) for r in (asked, new_smtp))
    out = cli.json("steps", "enqueue", "--file", "-", input=batch, expect=2, **refusing)
    assert out["error"]["code"] == "E_UNRESOLVABLE"
    assert [f["field"] for f in out["error"]["context"]["fields"]] == ["[1].provider"]
    assert steps(db_url) == 1
    # ... and beside a new one through http, the stored one comes back as it is.
    new_http = request(run_id="run-16", step_id="new-http", provider="http")
    batch = "\n".join(json.dumps(r) for r in (asked, new_http))
    made = cli.json("steps", "enqueue", "--file", "-", input=batch, **refusing)
    assert [(d["created"], d["ambiguity"]) for d in made["data"]] == [(False, "unresolvable"), (True, None)]
    assert made["data"][0]["id"] == first["id"] and made["meta"]["created"] == 1
    assert steps(db_url) == 2

    # Only the new step's refusal is recorded; the replays and the conflicts are not refusals.
    [recorded] = cli.json("refusals", "list", "--interface", "cli")["data"]
    assert recorded["reasons"] == ["provider"] and recorded["requests"] == 2


def test_the_http_api_and_the_python_api_answer_a_held_key_under_the_refusal(db_url):
    agent = make_key(db_url, "bot", "agent")
    asked = request(run_id="run-16h", step_id="s")
    with serving(db_url) as served:
        first = checked(served.client(agent).post("/v1/steps", json=asked))["data"]
    with serving(db_url, refuse_unresolvable=True) as served:
        client = served.client(agent)
        again = client.post("/v1/steps", json=asked)
        assert again.status_code == 200
        assert (checked(again)["data"]["id"], checked(again)["data"]["created"]) == (first["id"], False)
        other = client.post("/v1/steps", json={**asked, "provider": "null"})
        assert other.status_code == 409 and "enqueued through smtp" in checked(other)["error"]["message"]
        refused = client.post("/v1/steps", json=request(run_id="run-16h", step_id="new"))
        assert refused.status_code == 422 and checked(refused)["error"]["code"] == "E_UNRESOLVABLE"
        assert len(checked(client.get("/v1/refusals"))["data"]) == 1

    refusing = Settings.load(env={"EVQ_REFUSE_UNRESOLVABLE": "true"}).policy()
    held = evq_api.enqueue_own(db_url, asked, policy=refusing)
    assert (held.id, held.created, held.ambiguity) == (first["id"], False, "unresolvable")
    with psycopg.connect(db_url) as conn, conn.transaction():
        [a, b] = evq_api.enqueue_many(
            conn, [asked, request(run_id="run-16h", step_id="py", provider="http")], policy=refusing
        )
        assert (a.id, a.created, b.created) == (first["id"], False, True)
        with pytest.raises(evq_api.IdempotencyConflict, match="enqueued through smtp"):
            evq_api.enqueue(conn, {**asked, "provider": "http"}, policy=refusing)
    with pytest.raises(evq_api.Unresolvable):
        evq_api.enqueue_own(db_url, request(run_id="run-16h", step_id="py-new"), policy=refusing)
    assert steps(db_url) == 2
    assert rows(db_url, "SELECT provider FROM steps_now WHERE id = %s", (first["id"],)) == [{"provider": "smtp"}]
