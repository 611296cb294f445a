"""Issue 30: an API key's approval (always, policy, never) decides whether its sends wait for a
person on every interface that enqueues with a key: the CLI with EVQ_API_KEY, HTTP (a real `evq
serve`), MCP (tests/web/test_agent_default.py) and the Python API given ``api_key=``, all judged
by worker/approval_policy.py::applied in the enqueue's transaction. The Python API without a key keeps
the installation's rules. `never` drops the rules that ask a person, never the budgets. An admin
changes a key's approval with `evq keys update`; `keys list`, `policy show` (and GET /v1/policy,
an agent seeing its own key only) show it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import psycopg
import pytest

from evq.adapters.postgres.enqueue import enqueue
from evq.ops.settings import Settings
from evq.worker.errors import AuthFailed, Forbidden
from tests.acceptance.conftest import Evq
from tests.support import request, rows, serve_process, step_row

APPROVALS = ("default", "always", "policy", "never")
FIRST_CONTACT = {"EVQ_APPROVAL_FIRST_CONTACT": "address"}


def keys(db_url: str) -> tuple[Evq, dict[str, str]]:
    """The admin's `evq`, and an agent key per approval (``default``: none given)."""
    admin = Evq(db_url).json("keys", "create", "--name", "admin", "--role", "admin")["data"]["key"]
    evq = Evq(db_url, api_key=admin)
    made = {}
    for a in APPROVALS:
        given = [] if a == "default" else ["--approval", a]
        data = evq.json("keys", "create", "--name", f"bot-{a}", "--role", "agent", *given)["data"]
        assert data["approval"] == ("always" if a == "default" else a)
        made[a] = data["key"]
    return evq, made


def hold_rules(db_url: str, step_id: int) -> tuple[str, list[str]]:
    row = step_row(db_url, step_id)
    return row["status"], [r["rule"] for r in (row["hold"] or {}).get("rules", [])]


def test_each_keys_approval_holds_alike_on_the_cli_over_http_and_through_the_python_api(db_url):
    _evq, made = keys(db_url)
    # What each key's send gets: without an installation rule, and with the first-contact rule
    # (every recipient below is new, so the rule holds it under `policy`).
    expected = {
        "none": {"default": ["always"], "always": ["always"], "policy": None, "never": None},
        "first contact": {
            "default": ["always", "first_contact"],
            "always": ["always", "first_contact"],
            "policy": ["first_contact"],
            "never": None,
        },
    }
    n = iter(range(1000))

    def asked(interface: str, approval: str) -> dict[str, Any]:
        i = next(n)
        return request(run_id=f"r-{interface}", step_id=f"s-{i}", to=[f"new{i}@example.com"])

    for rules, env in (("none", {}), ("first contact", FIRST_CONTACT)):
        sent: dict[tuple[str, str], int] = {}
        with serve_process(db_url, **env) as served, httpx.Client(base_url=served.url, timeout=30) as web:
            for a, key in made.items():
                cli = Evq(db_url, api_key=key, **env).json(
                    "steps", "enqueue", "--file", "-", input=json.dumps(asked("cli", a))
                )
                sent["cli", a] = cli["data"]["id"]
                answer = web.post("/v1/steps", json=asked("http", a), headers={"Authorization": f"Bearer {key}"})
                assert answer.status_code == 201, answer.text
                sent["http", a] = answer.json()["data"]["id"]
                policy = Settings.load(env=env, database_url=db_url).policy()
                with psycopg.connect(db_url) as conn, conn.transaction():
                    sent["python", a] = enqueue(conn, asked("python", a), policy=policy, api_key=key).id
        for (interface, a), step_id in sent.items():
            rules_held = expected[rules][a]
            got = hold_rules(db_url, step_id)
            assert got == (("held", rules_held) if rules_held else ("pending", [])), (rules, interface, a, got)
            if rules_held and rules_held[0] == "always":
                assert step_row(db_url, step_id)["hold"]["rules"][0]["key"] == f"bot-{a}"
    # The Python API's key is recorded as every interface's is: its name, public id, interface.
    [decision] = rows(
        db_url,
        "SELECT d.actor, d.actor_key_id, d.interface FROM decisions d JOIN email_steps s ON s.decision_id = d.id "
        "WHERE s.id = %s",
        (sent["python", "never"],),
    )
    assert decision == {"actor": "bot-never", "actor_key_id": made["never"].split("_")[1], "interface": "python"}


def test_the_python_api_without_a_key_keeps_the_installations_rules_and_a_key_is_checked(db_url):
    evq, made = keys(db_url)
    operator = evq.json("keys", "create", "--name", "ops", "--role", "operator")["data"]["key"]
    none = Settings.load(env={}, database_url=db_url).policy()
    first = Settings.load(env=FIRST_CONTACT, database_url=db_url).policy()
    with psycopg.connect(db_url) as conn, conn.transaction():
        assert enqueue(conn, request(run_id="py"), policy=none, actor="billing").status == "pending"
        held = enqueue(conn, request(run_id="py"), policy=first)
    assert hold_rules(db_url, held.id) == ("held", ["first_contact"])
    with psycopg.connect(db_url) as conn:
        with pytest.raises(Forbidden):  # an operator's key may not enqueue
            enqueue(conn, request(run_id="py"), policy=none, api_key=operator)
        with pytest.raises(AuthFailed) as wrong:
            enqueue(conn, request(run_id="py"), policy=none, api_key=made["never"][:-4] + "AAAA")
        assert "api_key=" in (wrong.value.hint or "") and made["never"] not in str(wrong.value.to_dict())
        with pytest.raises(TypeError):
            enqueue(conn, request(run_id="py"), policy=none, api_key=made["never"], actor="someone")
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now WHERE run_id = 'py'")[0]["n"] == 2


def test_never_drops_the_rules_that_ask_a_person_but_a_budget_still_caps_it(db_url):
    _evq, made = keys(db_url)
    budget = {**FIRST_CONTACT, "EVQ_BUDGET_RUN_RECIPIENTS": "2"}
    agent = Evq(db_url, api_key=made["never"], **budget)

    def send(**env: str) -> dict[str, Any]:
        return agent.json("steps", "enqueue", "--to", "x@new.example", "--run-id", "r-b", "--step-id", "s", **env)

    ones = [
        agent.json("steps", "enqueue", "--file", "-", input=json.dumps(request(run_id="r-b", step_id=f"s{i}")))
        for i in range(3)
    ]
    assert [o["data"]["status"] for o in ones] == ["pending", "pending", "held"]
    [rule] = step_row(db_url, ones[2]["data"]["id"])["hold"]["rules"]
    assert (rule["rule"], rule["budget"], rule["cap"]) == ("budget", "run_recipients", 2)
    refused = Evq(db_url, api_key=made["never"], **budget, EVQ_BUDGET_ACTION="refuse").json(
        "steps", "enqueue", "--file", "-", input=json.dumps(request(run_id="r-b", step_id="s4")), expect=2
    )
    assert refused["error"]["code"] == "E_BUDGET"
    # The agent's own require_approval is its word, not a rule: it holds under never too.
    asked = agent.json(
        "steps", "enqueue", "--file", "-", input=json.dumps(request(run_id="r-own", require_approval=True))
    )
    assert hold_rules(db_url, asked["data"]["id"]) == ("held", ["requested"])


def test_an_admin_changes_a_keys_approval_and_every_listing_shows_it(db_url):
    evq, made = keys(db_url)
    agent = Evq(db_url, api_key=made["default"])
    asked = request(run_id="r-u")
    first = agent.json("steps", "enqueue", "--file", "-", input=json.dumps(asked))["data"]
    assert first["status"] == "held" and first["approval"]["approver_roles"] == ["operator", "admin"]
    # The dry run says the same of a new send: the key's hold, wait_for_approval.
    plan = agent.json("steps", "enqueue", "--dry-run", "--file", "-", input=json.dumps(request(run_id="r-u")))
    [item] = plan["data"]["plan"]
    assert (item["hold"]["rules"][0]["key"], item["next_action"]) == ("bot-default", "wait_for_approval")
    human = agent.run("steps", "enqueue", "--file", "-", input=json.dumps(request(run_id="r-u", step_id="text")))
    assert "never the key that enqueued it" in human.stdout
    assert "wait for the decision: evq steps wait " in human.stdout and "it expires at" in human.stdout
    changed = evq.json("keys", "update", "bot-default", "--approval", "never")["data"]
    assert (changed["approval"], changed["changed"]) == ("never", True)
    assert evq.json("keys", "update", "bot-default", "--approval", "never")["data"]["changed"] is False
    assert "approval: never" in evq.run("keys", "update", "bot-default", "--approval", "never").stdout
    # From its next enqueue on; what it held stays held.
    second = agent.json("steps", "enqueue", "--file", "-", input=json.dumps(request(run_id="r-u")))["data"]
    assert (second["status"], second["approval"]) == ("pending", None)
    assert step_row(db_url, first["id"])["status"] == "held"
    # A repeat of the held request is answered as its row is, with the same next steps, alone
    # (step_enqueue) or in a batch (step_enqueue_many: no rule, a key at never, so no gated path).
    again = agent.json("steps", "enqueue", "--file", "-", input=json.dumps(asked))["data"]
    lines = "\n".join(json.dumps(r) for r in (asked, request(run_id="r-u")))
    batch = agent.json("steps", "enqueue", "--file", "-", input=lines)["data"]
    for repeat in (again, batch[0]):
        assert (repeat["id"], repeat["created"], repeat["status"]) == (first["id"], False, "held")
        assert repeat["approval"] == first["approval"]
    assert batch[1]["status"] == "pending"

    listed = {k["name"]: k["approval"] for k in evq.json("keys", "list")["data"]}
    assert listed == {"admin": "policy", "bot-default": "never", "bot-always": "always"} | {
        "bot-policy": "policy",
        "bot-never": "never",
    }
    assert "APPROVAL" in evq.run("keys", "list").stdout.splitlines()[0]
    shown = evq.json("policy", "show")["data"]["keys"]
    assert [(k["name"], k["approval"]) for k in shown] == [
        ("admin", "policy"),
        ("bot-default", "never"),
        ("bot-always", "always"),
        ("bot-policy", "policy"),
        ("bot-never", "never"),
    ]
    assert "bot-always (agent): always" in evq.run("policy", "show").stdout
    with serve_process(db_url) as served, httpx.Client(base_url=served.url, timeout=30) as web:
        own = web.get("/v1/policy", headers={"Authorization": f"Bearer {made['always']}"}).json()["data"]["keys"]
        assert own == [{"name": "bot-always", "role": "agent", "approval": "always"}]  # not the other keys
