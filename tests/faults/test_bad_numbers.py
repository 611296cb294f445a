"""Issue 13: numbers JSON (or jsonb) cannot carry — NaN, Infinity, 1e999, a 5,000-digit integer —
anywhere in a request were E_INTERNAL / a 500 on every entry point. Each is now E_INVALID_ARG
naming the field, and nothing is written. Driven for real: the CLI in a subprocess, `evq serve`'s
app on a loopback port, the MCP server, the Python API on a real database."""

from __future__ import annotations

import json

import psycopg
import pytest

from evq.adapters.postgres.enqueue import enqueue
from evq.worker.errors import InvalidRequest
from tests.acceptance.conftest import Evq
from tests.support import request, rows
from tests.web.support import checked, serving

HUGE = "9" * 5000
# (JSON text of the rationale's "score", the same value as Python parsed it, if it can be one)
BAD = [
    ("NaN", float("nan")),
    ("Infinity", float("inf")),
    ("-Infinity", float("-inf")),
    ("1e999", float("inf")),
    (HUGE, None),
]


def _text(number: str, **overrides) -> str:
    data = request(run_id="nums", step_id="s", **overrides)
    data["decision"] = {"rationale": {"why": "test", "score": "__N__"}}
    return json.dumps(data).replace('"__N__"', number)


def _nothing_written(db_url: str) -> None:
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 0}]
    assert rows(db_url, "SELECT count(*)::int AS n FROM decisions") == [{"n": 0}]


@pytest.mark.parametrize("number", [n for n, _ in BAD], ids=["nan", "inf", "-inf", "1e999", "5000-digits"])
def test_the_cli_refuses_each_bad_number_naming_its_field(db_url, admin_key, number, tmp_path):
    evq = Evq(db_url, api_key=admin_key)
    out = evq.json("enqueue", "--file", "-", input=_text(number), expect=2)
    assert out["error"]["code"] == "E_INVALID_ARG"
    assert out["error"]["context"]["fields"][0]["field"] == "decision.rationale.score", out
    # JSON Lines: the second line is the bad one, and the error says so.
    lines = _text("1").replace('"s"', '"s0"') + "\n" + _text(number)
    out = evq.json("enqueue", "--file", "-", input=lines, expect=2)
    assert out["error"]["context"]["fields"][0]["field"] == "decision.rationale.score"
    assert "line 2" in out["error"]["context"]["fields"][0]["message"]
    flags = (
        "enqueue",
        "--run-id",
        "nums",
        "--step-id",
        "f",
        "--to",
        "ok@example.com",
        "--from",
        "a@example.org",
        "--subject",
        "s",
        "--text",
        "t",
        "--rationale",
        f'{{"score": {number}}}',
    )
    out = evq.json(*flags, expect=2)
    assert out["error"]["code"] == "E_INVALID_ARG" and "score" in out["error"]["context"]["fields"][0]["field"]
    _nothing_written(db_url)


def test_the_http_api_refuses_each_bad_number_with_422(db_url, admin_key):
    with serving(db_url) as served:
        api = served.client(admin_key)
        for number, _ in BAD:
            answer = api.post("/v1/steps", content=_text(number), headers={"Content-Type": "application/json"})
            assert answer.status_code == 422, (number[:10], answer.status_code, answer.text[:300])
            body = checked(answer)
            assert body["error"]["code"] == "E_INVALID_ARG"
            assert body["error"]["context"]["fields"][0]["field"] == "decision.rationale.score"
    _nothing_written(db_url)


def test_the_python_api_refuses_already_parsed_bad_numbers(db_url):
    """Floats that are already NaN/inf and a huge int, handed to enqueue() in the caller's transaction."""
    for _, value in BAD:
        data = request(run_id="nums", step_id="p")
        data["decision"] = {"rationale": {"deep": [{"score": value if value is not None else int(HUGE[:4000])}]}}
        with psycopg.connect(db_url) as conn, pytest.raises(InvalidRequest) as refused:
            enqueue(conn, data)
        assert refused.value.context["fields"][0]["field"] == "decision.rationale.deep[0].score"
    _nothing_written(db_url)


# MCP: tests/web/test_mcp_wire.py::test_raw_bad_numbers_in_tool_arguments_are_a_field_error sends the raw
# numbers over a real stdio subprocess (an SDK client would turn NaN into null before sending).


def test_notify_is_checked_against_the_domain_rules_at_enqueue(db_url):
    """Issue 13: a notify address on a blocked (or not allowed) domain was accepted, and its notice
    then silently refused at send. Now it is a field error at enqueue, on a real database."""
    from dataclasses import replace

    from tests.support import POLICY

    for policy in (
        replace(POLICY, blocked_domains=("blocked.example",)),
        replace(POLICY, allowed_domains=("example.com",)),
    ):
        data = request(run_id="nums", step_id="notify", notify="owner@blocked.example")
        with psycopg.connect(db_url) as conn, pytest.raises(InvalidRequest) as refused:
            enqueue(conn, data, policy=policy)
        assert [f["field"] for f in refused.value.context["fields"]] == ["notify"]
    _nothing_written(db_url)


@pytest.mark.parametrize("setting", ["EVQ_SMTP_TIMEOUT=nan", "EVQ_LEASE_SECONDS=inf", "EVQ_HTTP_DEDUPE_WINDOW=1e999"])
def test_a_worker_refuses_a_setting_that_is_not_a_finite_number(db_url, admin_key, smtp, setting):
    """float() reads "nan", "inf" and "1e999", and NaN passes every minimum. A worker that
    started with EVQ_SMTP_TIMEOUT=nan failed every send at connect ('Invalid value NaN'),
    spending attempts until the message was rejected; an infinite lease or dedupe window is
    an interval PostgreSQL cannot hold. Refused at start, naming the setting; nothing sent."""
    from tests.acceptance.conftest import smtp_env

    evq = Evq(db_url, api_key=admin_key)
    assert evq.run("enqueue", "--file", "-", input=json.dumps(request(run_id="nums", step_id="w"))).returncode == 0
    name, value = setting.split("=")
    done = evq.run("worker", "run", "--drain", "-o", "json", **smtp_env(smtp, EVQ_LISTEN="off", **{name: value}))
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-2000:])
    error = json.loads(done.stdout)["error"]
    assert error["code"] == "E_INVALID_ARG" and name in error["message"], error
    assert rows(db_url, "SELECT status, attempts FROM steps_now") == [{"status": "pending", "attempts": 0}]
    assert smtp.messages == []
