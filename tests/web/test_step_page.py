"""Issue 18's step page and trace against the real `evq serve` (httpx, and Chromium for the
email's frame): times in the operator's zone, the trace as a timeline with durations, the email
as it went out (its HTML in a sandboxed frame that runs nothing and loads nothing), and the CLI
line beside each action, run for real to the same effect."""

from __future__ import annotations

import html as html_lib
import http.server
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from tests.acceptance.conftest import make_key
from tests.support import free_port, rows, serve_process, step_row, valid, with_store
from tests.web.test_ops_page import _csrf, _signed_in, absent, browser, server, shot, sign_in, unknown  # noqa: F401  (fixtures)


def _titles(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<time datetime="([^"]+)" title="([^"]+)">', html)


def test_the_chosen_zone_changes_every_times_title_and_an_unknown_zone_is_refused_in_place(db_url):
    [step] = unknown(db_url, hours_ago=2, run_id="run-tz")
    key = make_key(db_url, "alice", "operator")
    # The server's default zone (EVQ_OPS_TIMEZONE), then a session's own choice on /ops/zone.
    with (
        serve_process(db_url, EVQ_OPS_TIMEZONE="Asia/Kolkata") as served,
        httpx.Client(base_url=served.url, timeout=30) as web,
    ):
        _signed_in(web, key)
        before = _titles(web.get(f"/ops/steps/{step.id}").text)
        assert before and all(title.endswith("+05:30 (IST)") for _, title in before), before
        token = _csrf(web.get("/ops/zone").text)
        saved = web.post("/ops/zone", data={"csrf": token, "tz": "America/New_York"})
        assert saved.status_code == 303 and saved.headers["location"] == "/ops/zone?saved=1"
        for path in (f"/ops/steps/{step.id}", "/ops/runs/run-tz"):
            after = _titles(web.get(path).text)
            assert after and all(re.search(r"-05:00 \(EST\)$", title) for _, title in after), (path, after)
            for instant, title in after:  # the same instant, only shown in another zone
                shown = datetime.fromisoformat(title.split(" ")[0])
                assert shown == datetime.fromisoformat(instant) and shown.utcoffset() == timedelta(hours=-5)

        for bad in ("Mars/Olympus", "../../etc/passwd", ""):
            refused = web.post("/ops/zone", data={"csrf": token, "tz": bad})
            assert refused.status_code == 422, (bad, refused.status_code)
            error = re.search(r'<div class="error" role="alert" id="error">(.*?)</div>', refused.text, flags=re.S)
            assert error and "E_INVALID_ARG" in error[1] and "tz" in error[1], refused.text[-2000:]
            assert 'id="zone-form"' in refused.text  # the form again, with the error above it
        # A refused choice changed nothing: still New York.
        assert _titles(web.get(f"/ops/steps/{step.id}").text)[0][1].endswith("(EST)")
        forged = web.post("/ops/zone", data={"csrf": "forged", "tz": "UTC"})
        assert forged.status_code == 403


def test_an_unknown_default_zone_stops_serve_at_startup_with_a_clear_error(db_url):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.child", "serve", "--port", str(free_port())],
        env={**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_OPS_TIMEZONE": "Mars/Olympus"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "EVQ_OPS_TIMEZONE" in proc.stderr + proc.stdout and "Mars/Olympus" in proc.stderr + proc.stdout


def cell(row: str, name: str) -> str:
    """The text of the row's cell of that class, as a person reads it."""
    found = re.search(rf'<td class="{name}"[^>]*>(.*?)</td>', row, flags=re.S)
    assert found, (name, row)
    return html_lib.unescape(re.sub(r"<[^>]+>", "", found[1])).strip()


def _attempted(store, started: datetime, answered: datetime):
    """One step whose attempt starts at ``started`` and whose answer is lost at ``answered``."""
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Unknown
    from evq.worker.transitions import decide

    async def run():
        made = await store.enqueue(
            valid(run_id="run-time", decision={"model": "m-9", "tool": "send_email", "rationale": {"why": "asked"}}),
            now=started - timedelta(seconds=10),
        )
        [claimed] = await store.claim(
            owner="w-7", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=started
        )
        settled = decide(
            claimed, Unknown("lost"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False
        )
        await store.record([settled], actor="w-7", now=answered)
        return made

    return run()


def test_the_trace_is_a_timeline_with_who_and_how_long(server, db_url):  # noqa: F811
    t0 = datetime.now(UTC) - timedelta(minutes=30)
    step = with_store(db_url, lambda store: _attempted(store, t0, t0 + timedelta(seconds=2.5)))
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        html = web.get("/ops/runs/run-time").text
    trace = re.search(r'<table class="rows timeline" id="trace">.*?</table>', html, flags=re.S)[0]
    events = re.findall(r'<tr class="kind-(\w+)">(.*?)</tr>', trace, flags=re.S)
    assert [k for k, _ in events] == ["decision", "enqueued", "attempt_started", "provider_response"]
    row = dict(events)
    assert cell(row["decision"], "what") == "The agent decided" and "why" in row["decision"]
    assert cell(row["attempt_started"], "what") == "Attempt started (attempt 1)"
    assert (
        cell(row["attempt_started"], "who").startswith("w-7")
        and cell(row["attempt_started"], "state") == "pending → in_flight"
    )
    assert cell(row["attempt_started"], "gap") == "+10.0 s"  # enqueued ten seconds before the claim
    assert cell(row["provider_response"], "gap") == "+2.5 s"
    assert cell(row["provider_response"], "took") == "2.5 s"  # the attempt: started → its answer
    assert cell(row["provider_response"], "state") == "in_flight → unknown"
    instants = [datetime.fromisoformat(i) for i in re.findall(r'<time datetime="([^"]+)"', trace)]
    assert instants == sorted(instants) and len(instants) == 4
    assert step_row(db_url, step.id)["status"] == "unknown"


class _Counter(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:
        _Counter.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/gif")
        self.end_headers()
        self.wfile.write(b"GIF89a")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def pixel_server() -> Iterator[int]:
    """A tiny HTTP server on loopback that counts every request it gets."""
    _Counter.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_email_renders_in_a_sandboxed_frame_that_runs_and_loads_nothing(server, browser, db_url, pixel_server):  # noqa: F811
    from selenium.webdriver.common.by import By

    port = pixel_server
    email_html = (
        f'<p id="hello">Hello from the HTML part</p><img src="http://127.0.0.1:{port}/pixel">'
        f"<script>document.body.setAttribute('data-ran','1');top.document.title='pwned';"
        f"new Image().src='http://127.0.0.1:{port}/script';</script>"
        f'<img src="/ops/static/ops.css?from-email">'
        f'<form action="http://127.0.0.1:{port}/form"><button id="go">go</button></form>'
    )
    [step] = unknown(db_url, hours_ago=1, text="Plain part, line one\nline two", html=email_html)
    sign_in(browser, server, make_key(db_url, "alice", "operator"))
    browser.get(server + f"/ops/steps/{step.id}")
    assert browser.find_element(By.CSS_SELECTOR, f"#text-part-{step.id}").text == "Plain part, line one\nline two"
    headers = browser.find_element(By.CSS_SELECTOR, "pre.headers").text
    assert "From: agent@example.org" in headers and "Message-ID: <" in headers
    assert re.fullmatch(r"\d+h\d\dm ago|\d+m ago", browser.find_element(By.CSS_SELECTOR, "#enqueued-at time").text)
    shot(browser, "12-step-email-rendered")
    frame = browser.find_element(By.ID, f"html-part-{step.id}")
    assert frame.get_attribute("sandbox") == ""  # present, with no allow-* token
    browser.switch_to.frame(frame)
    assert browser.find_element(By.ID, "hello").text == "Hello from the HTML part"
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ran") is None  # no script ran
    browser.find_element(By.ID, "go").click()  # a sandboxed frame may not submit forms
    browser.switch_to.default_content()
    assert browser.title.startswith(f"Step {step.id}")
    import time

    time.sleep(1.0)  # anything the frame were allowed to load would have arrived by now
    assert _Counter.seen == []
    # The same HTML as escaped source, on request.
    browser.find_element(By.ID, "html-source-link").click()
    assert browser.find_element(By.ID, "html-source").text == email_html
    assert absent(browser, By.CSS_SELECTOR, "iframe.email-html")  # asked once: the source's page is there
    assert _Counter.seen == []


def test_a_role_that_may_not_read_content_sees_neither_part(server, db_url):  # noqa: F811
    [step] = unknown(db_url, hours_ago=1, text="secret text", html="<p>secret html</p>")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        page = web.get(f"/ops/steps/{step.id}").text
    assert "secret" not in page and "<iframe" not in page and 'id="content-withheld"' in page
    assert "From: agent@example.org" in html_lib.unescape(page)  # the headers are not content


def test_the_cli_line_beside_each_action_is_the_command_table_s_and_does_the_same(server, db_url):  # noqa: F811
    from evq.ops.web.page.common import cli_equivalent

    [step] = unknown(db_url, hours_ago=1)
    key = make_key(db_url, "alice", "operator")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, key)
        page = web.get(f"/ops/steps/{step.id}").text
        lines = {
            v: html_lib.unescape(line)
            for v, line in re.findall(r'<code class="cli-line" data-verdict="(\w+)">(.*?)</code>', page)
        }
        assert set(lines) == {"accepted", "rejected", "retry"}
        assert lines["rejected"] == f"evq steps resolve {step.id} --as rejected --note ..."
        assert lines["rejected"] == cli_equivalent("steps.resolve", step_id=step.id, verdict="rejected", note="...")
        assert 'id="cancel-cli"' not in page  # an unknown row cannot be cancelled: no form, no line
        # A refused post shows the line with what was typed, quoted for the shell.
        typed = "it's in the log; $(touch /tmp/x)"
        refused = web.post(f"/ops/steps/{step.id}/close", data={"csrf": _csrf(page), "verdict": "bogus", "note": typed})
        assert refused.status_code == 422
        shown = re.search(r'<code class="cli-line" data-verdict="rejected">(.*?)</code>', refused.text)[1]
        assert shlex.split(html_lib.unescape(shown))[-1] == typed

    argv = shlex.split(lines["rejected"])
    assert argv[0] == "evq"
    ran = subprocess.run(
        [sys.executable, "-m", "tests.child", *argv[1:], "-o", "json"],
        env={**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    assert step_row(db_url, step.id)["status"] == "rejected"
    [evidence] = rows(db_url, "SELECT * FROM evidence WHERE kind = 'operator_resolved' AND step_id = %s", (step.id,))
    assert evidence["actor"] == "alice" and evidence["detail"]["note"] == "..."


def _dead_letter(store):
    """A step rejected after temporary failures only (its one attempt spent): requeueable."""
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Retryable
    from evq.worker.transitions import decide

    async def run():
        made = await store.enqueue(valid(run_id="run-dead"))
        [claimed] = await store.claim(owner="w-1", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={})
        settled = decide(
            claimed, Retryable("421 try later"), default_max_attempts=1, backoff=Backoff(1, 1), dedupe_window_open=False
        )
        await store.record([settled], actor="w-1")
        return made

    return run()


def test_a_dead_letter_is_requeued_from_its_page_beside_its_command_line(server, db_url):  # noqa: F811
    from evq.ops.web.page.common import cli_equivalent

    step = with_store(db_url, _dead_letter)
    assert (step_row(db_url, step.id)["status"], step_row(db_url, step.id)["reason"]) == (
        "rejected",
        "attempts_exhausted",
    )
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        page = web.get(f"/ops/steps/{step.id}").text
        assert 'id="requeue-form"' in page
        line = re.search(r'<p class="cli" id="requeue-cli">.*?<code class="cli-line">(.*?)</code>', page, flags=re.S)[1]
        assert html_lib.unescape(line) == cli_equivalent("steps.resolve", step_id=step.id, verdict="retry", note="...")
        done = web.post(
            f"/ops/steps/{step.id}/close",
            data={"csrf": _csrf(page), "verdict": "retry", "action": "requeue", "note": "the relay is back"},
        )
        assert done.status_code == 303 and done.headers["location"] == f"/ops/steps/{step.id}?done=requeued"
        after = web.get(done.headers["location"]).text
    assert step_row(db_url, step.id)["status"] == "retryable"
    assert 'id="done"' in after and 'id="requeue-form"' not in after


def test_a_held_send_shows_approve_deny_and_cancel_lines_and_its_rationale_as_labelled_text(server, db_url):  # noqa: F811
    from evq.ops.web.page.common import cli_equivalent
    from tests.support import held_steps

    rationale = {"why": "the customer asked for it " * 8, "checks": {"consent": "given", "limits": ["daily", "weekly"]}}
    [step] = with_store(
        db_url,
        lambda store: held_steps(
            store, decision={"model": "m-1", "tool": "send_email", "rationale": rationale}, html="<p>held html</p>"
        ),
    )
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        page = web.get(f"/ops/steps/{step.id}").text
    for action in ("approve", "deny", "cancel"):
        found = re.search(rf'<p class="cli" id="{action}-cli">.*?<code class="cli-line">(.*?)</code>', page, flags=re.S)
        assert found, action
        assert html_lib.unescape(found[1]) == cli_equivalent(f"steps.{action}", step_id=step.id, note="..."), action
    shown = re.search(r'<div class="rationale-block" id="rationale">(.*?)</div>', page, flags=re.S)[1]
    # Keys are labels; the nested object is a list of labels of its own inside its key's value.
    assert re.search(
        r"<dt>why</dt><dd><span class=\"rationale-text\">(the customer asked for it ){8}</span></dd>", shown
    )
    nested = re.search(r"<dt>checks</dt><dd>(.*?)</dd></dl>$", shown.strip(), flags=re.S)[1]
    assert '<dt>consent</dt><dd><span class="rationale-text">given</span></dd>' in nested
    assert '<li><span class="rationale-text">daily</span></li>' in nested and "<ol" in nested
    assert '<iframe class="email-html"' in page and "sandbox srcdoc=" in page and "&lt;p&gt;held html&lt;/p&gt;" in page
