"""The held lifecycle over HTTP (issue 17): POST /v1/steps/{id}/approve, /deny, /cancel on the
real app, with the roles every interface shares and the contract's bodies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.acceptance.conftest import make_key
from tests.support import execute, request, step_row
from tests.web.support import Served, checked, serving


@pytest.fixture
def api(db_url: str) -> Iterator[Served]:
    with serving(db_url) as served:
        yield served


def held(db_url: str, step_id: int) -> None:
    execute(
        db_url,
        "UPDATE email_steps SET status = 'held', reason = 'approval_required', held_since = now() WHERE id = %s",
        (step_id,),
    )
    execute(db_url, "DELETE FROM step_queue WHERE id = %s", (step_id,))  # a held step is owed no send yet


def test_approve_deny_and_cancel_over_http(api, db_url):
    agent = api.client(make_key(db_url, "bot", "agent", created_by=None))
    operator = api.client(make_key(db_url, "alice", "operator", created_by=None))
    ids = [checked(agent.post("/v1/steps", json=request(run_id="r-http", step_id=s)))["data"]["id"] for s in "abcd"]
    for step_id in ids[:3]:
        held(db_url, step_id)
    a, b, c, d = ids

    refused = agent.post(f"/v1/steps/{a}/approve", json={"note": "mine"})
    assert refused.status_code == 403 and checked(refused)["error"]["code"] == "E_AUTH_FAILED"
    missing = operator.post(f"/v1/steps/{a}/approve", json={})
    assert missing.status_code == 422 and checked(missing)["error"]["context"]["fields"][0]["field"] == "note"
    preview = checked(operator.post(f"/v1/steps/{a}/approve", json={"note": "ok", "dry_run": True}))["data"]
    assert preview["dry_run"] is True and step_row(db_url, a)["status"] == "held"
    done = operator.post(f"/v1/steps/{a}/approve", json={"note": "checked", "subject": "Corrected"})
    assert done.status_code == 200 and checked(done)["data"]["fields"] == ["subject"]
    assert step_row(db_url, a)["status"] == "pending"
    again = operator.post(f"/v1/steps/{a}/approve", json={"note": "again"})
    assert again.status_code == 409 and checked(again)["error"]["code"] == "E_CONFLICT"

    assert agent.post(f"/v1/steps/{b}/deny", json={"note": "no"}).status_code == 403
    assert checked(operator.post(f"/v1/steps/{b}/deny", json={"note": "no"}))["data"]["reason"] == "denied"

    # The agent cancels its own held and pending sends; nobody cancels what is closed.
    assert checked(agent.post(f"/v1/steps/{c}/cancel", json={"note": "not needed"}))["data"]["from_status"] == "held"
    assert checked(agent.post(f"/v1/steps/{d}/cancel", json={}))["data"]["from_status"] == "pending"
    closed = agent.post(f"/v1/steps/{d}/cancel", json={})
    assert closed.status_code == 409
    assert [step_row(db_url, i)["reason"] for i in (b, c, d)] == ["denied", "cancelled", "cancelled"]
    assert operator.post("/v1/steps/999999/cancel", json={}).status_code == 404


def test_a_corrected_text_over_http_says_what_becomes_of_the_html_part(api, db_url):
    """Issue 29, through the HTTP API: a corrected text beside the agent's HTML part is refused
    (422, field html); drop_html removes the part."""
    agent = api.client(make_key(db_url, "bot", "agent", created_by=None))
    operator = api.client(make_key(db_url, "alice", "operator", created_by=None))
    asked = request(run_id="r-html", text="On Tuesday", html="<p>On Tuesday</p>")
    step = checked(agent.post("/v1/steps", json=asked))["data"]["id"]
    held(db_url, step)
    fix = {"note": "moved", "text": "On Wednesday"}
    refused = operator.post(f"/v1/steps/{step}/approve", json=fix)
    assert refused.status_code == 422 and checked(refused)["error"]["context"]["fields"][0]["field"] == "html"
    assert step_row(db_url, step)["status"] == "held"
    done = checked(operator.post(f"/v1/steps/{step}/approve", json={**fix, "drop_html": True}))["data"]
    assert done["fields"] == ["text", "html"]
    payload = step_row(db_url, step)["payload"]
    assert (payload["text"], payload["html"]) == ("On Wednesday", None)
