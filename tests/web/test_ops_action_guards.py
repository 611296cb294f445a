"""What a hostile review found the ops page's actions let through (issue 18): a bulk apply
not tied to the states its action applies to, preview counts that claimed an exactness they
lacked, a close's notice taken from the form and not from what happened, a CLI line missing
fields the form posts, NUL bytes and out-of-range ids reaching PostgreSQL (a 500), and zone
names outside the IANA list. Real `evq serve` + httpx against real PostgreSQL."""

from __future__ import annotations

import html as html_lib
import re

import httpx

from tests.acceptance.conftest import make_key
from tests.web.support import form_fields
from tests.web.test_ops_page import _csrf, _signed_in, server
from tests.web.test_step_lists import after_one_try, held, pending, preview, step_row, unknown

__all__ = ["server"]  # the fixture the tests below use


def _operator(web: httpx.Client, db_url: str) -> str:
    _signed_in(web, make_key(db_url, "alice", "operator"))
    return _csrf(web.get("/ops/steps").text)


def test_a_bulk_apply_refuses_a_seen_state_or_verdict_its_action_does_not_apply_to(server, db_url):
    [u] = unknown(db_url, run_id="run-g")
    [r] = after_one_try(db_url, 1, max_attempts=1, run_id="run-g")  # rejected, requeueable
    with httpx.Client(base_url=server, timeout=30) as web:
        token = _operator(web, db_url)
        forged = (
            {"action": "retry", "status": "rejected", "seen": f"{u}:unknown"},  # a retry of an unknown row
            {"action": "close", "verdict": "retry", "seen": f"{u}:unknown"},  # the verdict the form leaves out
            {"action": "cancel", "seen": f"{u}:unknown"},
            {"action": "approve", "seen": f"{r}:rejected"},
            {"action": "close", "verdict": "rejected", "seen": f"{r}:rejected"},
        )
        for form in forged:
            answer = web.post("/ops/bulk/apply", data={"csrf": token, "note": "x", **form})
            assert answer.status_code == 422, (form, answer.status_code, answer.text[-1500:])
        # A preview's own rows still apply.
        shown = preview(web, token, status="rejected", action="retry", note="provider is back", run_id="run-g")
        done = web.post("/ops/bulk/apply", data=form_fields(shown.text, "/ops/bulk/apply"))
        assert done.status_code == 200, done.text[-1500:]
    assert step_row(db_url, u)["status"] == "unknown"
    assert step_row(db_url, r)["status"] == "retryable"


def test_a_bulk_retry_of_ids_keeps_the_state_check_in_the_service(db_url):
    """Selection with ids and statuses: a row of the ids outside the statuses is a conflict."""
    from evq.ops.app import service
    from evq.ops.app.service import Caller, Selection
    from evq.worker.resolution import Resolution
    from tests.support import with_store

    [u] = unknown(db_url, run_id="run-s")
    key = make_key(db_url, "alice", "operator")

    async def retry(store):  # type: ignore[no-untyped-def]
        return await service.resolve(
            store,
            Caller(key),
            Resolution.parse("retry", "forged"),
            Selection(statuses=("rejected",), ids=(u,)),
            default_max_attempts=3,
        )

    reply = with_store(db_url, retry)
    [result] = reply.data["results"]
    assert result["outcome"] == "failed" and result["error"]["code"] == "E_CONFLICT", result
    assert step_row(db_url, u)["status"] == "unknown"


def test_a_preview_says_the_true_count_when_more_match_than_it_shows(server, db_url):
    unknown(db_url, 503, run_id="run-many")
    pending(db_url, 502, run_id="run-many")
    with httpx.Client(base_url=server, timeout=60) as web:
        token = _operator(web, db_url)
        closing = preview(web, token, action="close", verdict="rejected", note="n", run_id="run-many")
        cancelling = preview(web, token, action="cancel", status="pending", note="n", run_id="run-many")
    assert "at most 500 at a time: 503 match" in closing.text, closing.text[-2000:]
    assert "at most 500 at a time: 502 match" in cancelling.text, cancelling.text[-2000:]


def test_a_close_notice_follows_what_happened_and_a_done_url_only_what_the_step_is(server, db_url):
    [u, v] = unknown(db_url, 2, run_id="run-n")
    [h] = held(db_url, 1, run_id="run-n")
    with httpx.Client(base_url=server, timeout=30) as web:
        token = _operator(web, db_url)
        form = {"csrf": token, "verdict": "rejected", "reason": "checked", "note": "x", "action": "requeue"}
        closed = web.post(f"/ops/steps/{u}/close", data=form)
        assert closed.status_code == 303 and "requeued" not in closed.headers["location"], closed.headers
        assert step_row(db_url, u)["status"] == "rejected"
        for done in ("approved", "denied", "cancelled", "requeued"):
            page = web.get(f"/ops/steps/{v}?done={done}")  # an unknown step: none of these happened
            assert page.status_code == 200 and 'id="done"' not in page.text, done
        assert 'id="done"' not in web.get(f"/ops/steps/{h}?done=approved").text  # still held
        cancel = web.post(f"/ops/steps/{h}/cancel", data={"csrf": token, "note": "not needed"})
        assert cancel.status_code == 303, cancel.text[-1500:]
        after = web.get(cancel.headers["location"]).text
        assert 'id="done"' in after and "Cancelled:" in after
        assert 'id="done"' not in web.get(f"/ops/steps/{h}?done=denied").text


def test_the_close_cli_line_carries_every_field_the_form_posted(server, db_url):
    [u] = unknown(db_url, run_id="run-c")
    with httpx.Client(base_url=server, timeout=30) as web:
        token = _operator(web, db_url)
        typed = {"reason": "checked_log", "evidence_url": "https://log.example/1", "provider_message_id": "pm-7"}
        refused = web.post(f"/ops/steps/{u}/close", data={"csrf": token, "verdict": "nope", "note": "n", **typed})
    assert refused.status_code == 422, refused.text[-1500:]
    lines = [
        html_lib.unescape(x) for x in re.findall(r'<code class="cli-line" data-verdict="[^"]+">([^<]*)', refused.text)
    ]
    assert lines
    for line in lines:
        assert "--reason checked_log" in line and "--provider-message-id pm-7" in line, line
        assert "--evidence-url https://log.example/1" in line and "--note n" in line, line


def test_a_nul_byte_or_an_id_past_bigint_in_a_form_is_refused_not_a_500(server, db_url):
    [h] = held(db_url, 1, run_id="run-z")
    with httpx.Client(base_url=server, timeout=30) as web:
        token = _operator(web, db_url)
        posts = (
            ("/ops/bulk/preview", {"action": "cancel", "note": "n", "q": "a\x00"}, "q"),
            ("/ops/bulk/preview", {"action": "cancel", "note": "n", "run_id": "a\x00"}, "run_id"),
            ("/ops/unknown/preview", {"verdict": "rejected", "note": "n", "run_id": "a\x00"}, "run_id"),
            (f"/ops/steps/{h}/cancel", {"note": "a\x00b"}, "note"),
            ("/ops/bulk/apply", {"action": "cancel", "note": "a\x00b", "seen": f"{h}:held"}, "note"),
        )
        for path, form, field in posts:
            answer = web.post(path, data={"csrf": token, **form})
            assert answer.status_code == 422, (path, answer.status_code, answer.text[-800:])
            assert field in answer.text
        huge = web.post(
            "/ops/bulk/apply", data={"csrf": token, "action": "cancel", "note": "n", "seen": f"{10**29}:pending"}
        )
        assert huge.status_code == 422 and "seen" in huge.text, huge.text[-800:]
    assert step_row(db_url, h)["status"] == "held"
    agent = make_key(db_url, "bot", "operator")
    with httpx.Client(base_url=server, timeout=30, headers={"Authorization": f"Bearer {agent}"}) as api:
        answer = api.post(f"/v1/steps/{h}/cancel", json={"note": "a\u0000b"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "E_INVALID_ARG" and "note" in answer.text
    assert step_row(db_url, h)["status"] == "held"


def test_the_zone_form_takes_only_iana_zone_names(server, db_url):
    with httpx.Client(base_url=server, timeout=30) as web:
        token = _operator(web, db_url)
        for name in ("right/Europe/Berlin", "posix/Europe/Berlin", "posixrules", "localtime", "Factory"):
            answer = web.post("/ops/zone", data={"csrf": token, "tz": name})
            assert answer.status_code == 422, (name, answer.status_code)
        assert web.post("/ops/zone", data={"csrf": token, "tz": "Europe/Berlin"}).status_code == 303
        assert "right/" not in web.get("/ops/zone").text
