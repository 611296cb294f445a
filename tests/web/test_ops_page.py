"""An operator with only a browser: sign in, filter unknown rows, open a trace, close a
row (it leaves the list; evidence records who and why), see a conflict, bulk close after a
preview; attacker-controlled text stays text. Real headless Chromium (Debian's chromium +
chromium-driver, through Selenium) against the real `evq serve` in a subprocess.
Screenshots of every page go to test-artifacts/ops-page/."""

from __future__ import annotations

import html as html_lib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from evq.worker.resolution import Resolution
from tests.acceptance.conftest import make_key
from tests.support import rows, serve_process, step_row, unknown_steps, with_store
from tests.web.support import chromium, form_fields

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ops-page"
XSS = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>Invoice"


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """`evq serve` on a free loopback port, until the test ends."""
    with serve_process(db_url) as served:
        yield served.url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[object]:
    with chromium(tmp_path / "chromium", "--window-size=1400,1000") as driver:
        yield driver


def unknown(db_url: str, n: int = 1, *, hours_ago: float, **request) -> list:
    at = datetime.now(UTC) - timedelta(hours=hours_ago)
    return with_store(db_url, lambda store: unknown_steps(store, n, now=at, **request))


def absent(driver, by: str, selector: str) -> bool:
    """Nothing matches, asked once (the implicit wait is for what should appear)."""
    driver.implicitly_wait(0)
    try:
        return not driver.find_elements(by, selector)
    finally:
        driver.implicitly_wait(10)


def shot(driver, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def sign_in(driver, url: str, key: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/ops")
    assert driver.current_url.endswith("/ops/login")
    driver.find_element(By.ID, "key").send_keys(key)
    click_and_load(driver, driver.find_element(By.ID, "sign-in"))


def fill_verdict(form, verdict: str, note: str, **extra: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(form.find_element(By.NAME, "verdict")).select_by_value(verdict)
    form.find_element(By.NAME, "note").send_keys(note)
    for name, value in extra.items():
        form.find_element(By.NAME, name).send_keys(value)


def click_and_load(driver, element) -> None:
    """Click something that loads a new page, and wait until it has: reading the page right
    after a click may otherwise still see the old one (a slow, loaded machine makes that likely)."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def old_page_gone(_driver) -> bool:
        # Chromium answers a question about a node of the page being replaced either with
        # "stale element" or, mid-navigation, with "Node with given id does not belong to the
        # document" (an inspector error selenium does not map to staleness): both mean gone.
        try:
            return bool(expected_conditions.staleness_of(old)(_driver))
        except WebDriverException as error:
            return "does not belong to the document" in str(error)

    WebDriverWait(driver, 20).until(old_page_gone)


def test_an_operator_with_only_a_browser_closes_unknown_rows_with_an_audit_trail(server, browser, db_url):
    from selenium.webdriver.common.by import By

    [invoice] = unknown(db_url, hours_ago=3, run_id="run-x", subject=XSS, to=["Bob <bob@victim.example>"])
    [other] = unknown(db_url, hours_ago=2, run_id="run-y")
    bulk = unknown(db_url, 2, hours_ago=1, run_id="run-z")
    alice = make_key(db_url, "alice", "operator")
    driver = browser

    driver.get(server + "/ops")
    shot(driver, "01-sign-in")
    sign_in(driver, server, alice)
    assert driver.find_element(By.ID, "who").text.startswith("alice (operator")
    counts = driver.find_element(By.ID, "counts").text
    assert "unknown" in counts and "4" in counts.split()
    assert f"step {invoice.id}" in driver.find_element(By.ID, "oldest-unknown").text
    shot(driver, "02-overview")

    driver.get(server + "/ops/unknown")
    table = driver.find_element(By.ID, "unknown-rows")
    assert [r.get_attribute("data-step") for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")] == [
        str(s.id) for s in (invoice, other, *bulk)
    ]
    row = table.find_element(By.CSS_SELECTOR, f'tr[data-step="{invoice.id}"]')
    # Attacker-controlled text is shown as text: no script ran, no element was made of it.
    assert XSS in row.find_element(By.CSS_SELECTOR, "td.subject").text
    assert driver.title == "Unknown rows · evq" and absent(driver, By.CSS_SELECTOR, "td.subject img")
    # Recipients show only their domain until expanded.
    assert "…@victim.example" in row.text and "bob@" not in row.text
    shot(driver, "03-unknown-rows")

    form = driver.find_element(By.ID, "filters")
    form.find_element(By.NAME, "run_id").send_keys("run-x")
    form.find_element(By.NAME, "expand").click()
    click_and_load(driver, driver.find_element(By.ID, "apply-filters"))
    assert "run_id=run-x" in driver.current_url and "expand=1" in driver.current_url  # a view can be shared
    rows_shown = driver.find_elements(By.CSS_SELECTOR, "#unknown-rows tbody tr[data-step]")
    assert [r.get_attribute("data-step") for r in rows_shown] == [str(invoice.id)]
    assert "bob@victim.example" in rows_shown[0].text
    shot(driver, "04-filtered")

    click_and_load(driver, rows_shown[0].find_element(By.LINK_TEXT, "run-x"))
    trace = driver.find_element(By.ID, "trace").text
    for label in ("The agent decided", "Send enqueued", "Attempt started", "The provider answered"):
        assert label in trace
    shot(driver, "05-trace")

    driver.back()
    click_and_load(driver, driver.find_element(By.LINK_TEXT, str(invoice.id)))
    assert driver.find_element(By.ID, "subject").text == XSS and driver.title.startswith(f"Step {invoice.id}")
    shot(driver, "06-step")
    form = driver.find_element(By.ID, "close-form")
    fill_verdict(
        form,
        "accepted",
        "found in the provider log",
        reason="found_in_provider_log",
        evidence_url="https://logs.example/q-1",
    )
    click_and_load(driver, driver.find_element(By.ID, "close"))
    assert "run_id=run-x" in driver.current_url and f"closed={invoice.id}" in driver.current_url
    assert driver.find_element(By.ID, "none").text == "No unknown rows match."
    shot(driver, "07-closed-and-gone")
    [evidence] = rows(db_url, "SELECT * FROM evidence WHERE kind = 'operator_resolved'")
    assert evidence["step_id"] == invoice.id and evidence["actor"] == "alice"
    assert evidence["detail"]["note"] == "found in the provider log"
    assert evidence["detail"]["reference"]["evidence_url"] == "https://logs.example/q-1"
    assert evidence["reason"] == "found_in_provider_log"
    assert step_row(db_url, invoice.id)["status"] == "accepted"

    # Someone else closes a row while it is open here: the conflict is shown, not swallowed.
    driver.get(server + f"/ops/steps/{other.id}")
    with_store(
        db_url,
        lambda store: store.resolve(
            other.id, Resolution.parse("rejected", "bob was first"), actor="bob", default_max_attempts=5
        ),
    )
    fill_verdict(driver.find_element(By.ID, "close-form"), "accepted", "mine")
    click_and_load(driver, driver.find_element(By.ID, "close"))
    error = driver.find_element(By.ID, "error").text
    assert "E_CONFLICT" in error and "rejected, not unknown" in error
    assert driver.find_element(By.ID, "status").text == "rejected"
    shot(driver, "08-conflict")

    driver.get(server + "/ops/unknown?run_id=run-z")
    form = driver.find_element(By.ID, "bulk-form")
    fill_verdict(form, "rejected", "provider outage, resent by hand")
    click_and_load(driver, driver.find_element(By.ID, "bulk-preview"))
    assert re.search(r"^2 unknown rows would become rejected", driver.find_element(By.ID, "preview-count").text)
    assert {step_row(db_url, s.id)["status"] for s in bulk} == {"unknown"}  # a preview changes nothing
    shot(driver, "09-bulk-preview")
    click_and_load(driver, driver.find_element(By.ID, "bulk-confirm"))
    results = driver.find_element(By.ID, "bulk-results")
    assert driver.find_element(By.TAG_NAME, "h1").text == "Bulk close: 2 closed, 0 failed"
    assert results.text.count("unknown → rejected") == 2
    shot(driver, "10-bulk-done")
    assert {step_row(db_url, s.id)["status"] for s in bulk} == {"rejected"}
    assert len(rows(db_url, "SELECT 1 FROM evidence WHERE kind = 'operator_resolved' AND actor = 'alice'")) == 3


def test_an_agent_key_may_look_but_not_close(server, browser, db_url):
    from selenium.webdriver.common.by import By

    [step] = unknown(db_url, hours_ago=1)
    sign_in(browser, server, make_key(db_url, "bot", "agent"))
    assert "read only" in browser.find_element(By.ID, "who").text
    browser.get(server + f"/ops/steps/{step.id}")
    assert absent(browser, By.ID, "close-form")
    assert "may only read" in browser.find_element(By.TAG_NAME, "main").text
    shot(browser, "11-agent-read-only")


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match
    return match[1]


def test_session_cookie_csrf_and_revocation(server, db_url):
    [step] = unknown(db_url, hours_ago=1)
    alice = make_key(db_url, "alice", "operator")
    with httpx.Client(base_url=server, timeout=30) as web:
        login = web.get("/ops/login")
        assert "default-src 'none'" in login.headers["content-security-policy"]
        cookie = login.headers["set-cookie"]
        assert (
            "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict") and "Path=/ops" in cookie
        )

        wrong = web.post("/ops/login", data={"csrf": _csrf(login.text), "key": alice + "x"})
        assert wrong.status_code == 401 and "E_AUTH_FAILED" in wrong.text and alice not in wrong.text
        no_csrf = web.post("/ops/login", data={"key": alice})
        assert no_csrf.status_code == 403
        signed = web.post("/ops/login", data={"csrf": _csrf(web.get("/ops/login").text), "key": alice})
        assert signed.status_code == 303 and signed.headers["location"] == "/ops"

        page = web.get(f"/ops/steps/{step.id}")
        token = _csrf(page.text)
        forged = web.post(f"/ops/steps/{step.id}/close", data={"verdict": "accepted", "note": "x", "csrf": "forged"})
        assert forged.status_code == 403 and step_row(db_url, step.id)["status"] == "unknown"
        no_note = web.post(f"/ops/steps/{step.id}/close", data={"verdict": "accepted", "note": " ", "csrf": token})
        assert no_note.status_code == 422 and "note" in no_note.text
        assert step_row(db_url, step.id)["status"] == "unknown"

        with_store(db_url, lambda store: store.revoke_key("alice", actor="test-admin"))
        after = web.get("/ops/unknown")
        assert after.status_code == 303 and after.headers["location"] == "/ops/login?ended=revoked"
        tampered = web.cookies.get("evq_session", path="/ops")
        assert tampered
    # A cookie that is not ours is no session.
    with httpx.Client(base_url=server, timeout=30, cookies={"evq_session": "e30.AAAA"}) as other:
        assert other.get("/ops").status_code == 303


def _signed_in(web: httpx.Client, key: str) -> None:
    signed = web.post("/ops/login", data={"csrf": _csrf(web.get("/ops/login").text), "key": key})
    assert signed.status_code == 303, signed.text[:500]


def test_every_form_needs_the_csrf_token_and_a_reader_cannot_close(server, db_url):
    """Each POST of the page refuses a missing or foreign CSRF token and changes nothing; an agent
    key's session is refused a close it forges (with a good token); every form the templates have
    carries the token."""
    from evq.ops.web import page

    steps = unknown(db_url, 2, hours_ago=1)
    close = {"verdict": "rejected", "note": "forged"}
    posts = {
        "/ops/login": {"key": make_key(db_url, "alice", "operator")},
        "/ops/logout": {},
        f"/ops/steps/{steps[0].id}/close": close,
        "/ops/unknown/preview": close,
        "/ops/unknown/close": {**close, "ids": ",".join(str(s.id) for s in steps)},
        "/ops/bulk/preview": {**close, "action": "close", "status": "unknown"},
        "/ops/bulk/apply": {**close, "action": "close", "seen": ",".join(f"{s.id}:unknown" for s in steps)},
        f"/ops/steps/{steps[0].id}/approve": {"note": "forged"},
        f"/ops/steps/{steps[0].id}/deny": {"note": "forged"},
        f"/ops/steps/{steps[0].id}/cancel": {"note": "forged"},
        "/ops/zone": {"tz": "Europe/Berlin"},
    }
    forms = {route.path for route in page.router.routes if "POST" in route.methods}
    assert {re.sub(r"\{step_id\}", str(steps[0].id), f) for f in forms} == set(posts)
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, posts["/ops/login"]["key"])
        good = _csrf(web.get("/ops/unknown").text)
        for path, data in posts.items():
            for token in (None, "forged", good + "x"):
                answer = web.post(path, data={**data, **({"csrf": token} if token else {})})
                assert answer.status_code == 403 and "CSRF" in answer.text, (path, token, answer.status_code)
        assert web.get("/ops").status_code == 200  # still signed in: the refused logout did nothing
    assert {step_row(db_url, s.id)["status"] for s in steps} == {"unknown"}
    assert rows(db_url, "SELECT count(*)::int AS n FROM evidence WHERE kind = 'operator_resolved'") == [{"n": 0}]

    with httpx.Client(base_url=server, timeout=30) as reader:
        _signed_in(reader, make_key(db_url, "bot", "agent"))
        token = _csrf(reader.get("/ops/unknown").text)
        forged = reader.post(f"/ops/steps/{steps[0].id}/close", data={**close, "csrf": token})
        assert forged.status_code == 403 and "E_AUTH_FAILED" in forged.text
        bulk = reader.post("/ops/unknown/close", data={**posts["/ops/unknown/close"], "csrf": token})
        assert bulk.status_code == 403 and "E_AUTH_FAILED" in bulk.text
        bulk = reader.post("/ops/bulk/apply", data={**posts["/ops/bulk/apply"], "csrf": token})
        assert bulk.status_code == 403 and "E_AUTH_FAILED" in bulk.text
        approve = reader.post(f"/ops/steps/{steps[0].id}/approve", data={"note": "forged", "csrf": token})
        assert approve.status_code == 403 and "E_AUTH_FAILED" in approve.text
    assert {step_row(db_url, s.id)["status"] for s in steps} == {"unknown"}

    templates = Path(page.__file__).parents[1] / "templates"
    for template in templates.glob("*.html"):
        for form in re.findall(r"<form\b[^>]*>.*?</form>", template.read_text(), flags=re.S):
            if 'method="post"' in form:
                assert 'name="csrf" value="{{ session.csrf }}"' in form, (template.name, form[:200])


def test_a_bulk_close_shows_the_rows_someone_else_closed_first(server, db_url):
    """Between the preview and the confirmation someone closes one of the rows: that row is
    shown as a conflict (E_CONFLICT, the state it is in), the others are closed."""
    first, second = unknown(db_url, 2, hours_ago=1, run_id="run-b")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/unknown?run_id=run-b").text)
        preview = web.post(
            "/ops/unknown/preview", data={"csrf": token, "run_id": "run-b", "verdict": "rejected", "note": "outage"}
        )
        assert preview.status_code == 200 and re.search(r"<strong>2</strong> unknown rows would become", preview.text)
        form = form_fields(preview.text, "/ops/unknown/close")
        assert form["ids"] == f"{first.id},{second.id}"
        with_store(
            db_url,
            lambda store: store.resolve(
                first.id, Resolution.parse("accepted", "bob was first"), actor="bob", default_max_attempts=5
            ),
        )
        done = web.post("/ops/unknown/close", data=form)
    assert done.status_code == 200 and "Bulk close: 1 closed, 1 failed" in done.text
    conflict = re.search(rf'<tr class="failed"><td><a href="/ops/steps/{first.id}">.*?</tr>', done.text, flags=re.S)
    assert conflict and "E_CONFLICT" in conflict[0], done.text[-3000:]
    assert step_row(db_url, first.id)["status"] == "accepted" and step_row(db_url, second.id)["status"] == "rejected"


def test_the_overview_shows_counts_the_oldest_unknown_with_its_age_and_the_queue_lag(server, db_url):
    from tests.support import valid

    [oldest] = unknown(db_url, hours_ago=3)
    unknown(db_url, hours_ago=1)
    at = datetime.now(UTC) - timedelta(hours=2)
    with_store(db_url, lambda store: store.enqueue(valid(), now=at))  # claimable for two hours: the lag
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        html = web.get("/ops").text
        listed = web.get("/ops/unknown").text
    # Each unknown row with the adapter's last answer (unknown_steps' worker lost the connection).
    answers = re.findall(r'<tr data-step="\d+">.*?</tr>', listed, flags=re.S)
    assert len(answers) == 2 and all("connection lost after the final dot" in a for a in answers)
    counts = re.search(r'<table class="counts" id="counts"[^>]*>.*?</table>', html, flags=re.S)[0]
    shown = dict(
        zip(
            re.findall(r"<th>(\w+)</th>", counts),
            re.findall(r'<td class="status-\w+"[^>]*>(\d+)</td>', counts),
            strict=True,
        )
    )
    assert shown == {
        "held": "0",
        "pending": "1",
        "in_flight": "0",
        "retryable": "0",
        "unknown": "2",
        "accepted": "0",
        "rejected": "0",
    }
    oldest_shown = re.search(r'<dd id="oldest-unknown"[^>]*>(.*?)</dd>', html, flags=re.S)[1]
    assert f"step {oldest.id}</a>, waiting 3h0" in oldest_shown
    assert re.search(r'<dd id="queue-lag"[^>]*>2h0\dm ', html)


def test_a_runs_trace_shows_the_decision_the_attempts_and_the_operators_close_in_time_order(server, db_url):
    decision = {
        "model": "m-7",
        "tool": "send_email",
        "prompt_version": "p-3",
        "instruction_version": "v2",
        "rationale": "asked",
    }
    [step] = unknown(db_url, hours_ago=1, run_id="run-t", intent="remind <b>bob</b>", decision=decision)
    with_store(
        db_url,
        lambda store: store.resolve(
            step.id, Resolution.parse("accepted", "in the provider log"), actor="alice", default_max_attempts=5
        ),
    )
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        html = web.get("/ops/runs/run-t").text
    trace = re.search(r'<table class="rows timeline" id="trace">.*?</table>', html, flags=re.S)[0]
    kinds = re.findall(r'<tr class="kind-(\w+)">', trace)
    assert kinds == ["decision", "enqueued", "attempt_started", "provider_response", "operator_resolved"]
    row = dict(zip(kinds, re.findall(r'<tr class="kind-\w+">(.*?)</tr>', trace, flags=re.S), strict=True))
    for shown in ("m-7", "send_email", "p-3", "v2", "remind &lt;b&gt;bob&lt;/b&gt;"):
        assert shown in row["decision"], (shown, row["decision"])
    assert "connection lost after the final dot" in row["provider_response"]
    assert "alice" in row["operator_resolved"] and "unknown → accepted" in row["operator_resolved"]
    assert "in the provider log" in row["operator_resolved"]


def test_the_overview_says_which_provider_evq_stopped_sending_to_and_why(server, db_url):
    """An open circuit (written as a worker writes it) is on the overview with its reason and the
    provider's own words, escaped; a closed one is not."""

    async def open_it(store):
        await store.circuit_trip(
            provider="smtp",
            reason="auth_failed",
            actor="w1",
            probe_base=60,
            probe_max=600,
            detail="smtp authentication failed (535) " + XSS,
        )
        await store.circuit_trip(
            provider="http", reason="connection_refused", detail="refused", actor="w1", probe_base=60, probe_max=600
        )
        await store.circuit_close(provider="http", reason="probe_succeeded", detail="back", actor="w1")

    with_store(db_url, open_it)
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        html = web.get("/ops").text
    banner = re.search(r'<div class="error circuit" id="circuit-smtp">(.*?)</div>', html, flags=re.S)[1]
    assert "Not sending through smtp" in banner and "<code>auth_failed</code>" in banner
    assert "535" in banner and "<script>" not in banner and "&lt;script&gt;" in banner
    assert "Next probe in" in banner
    assert 'id="circuit-http"' not in html


def test_each_view_of_a_step_says_what_to_do_next(server, db_url):
    """The ambiguity contract on the page: an unknown smtp step (nothing can settle it on its own)
    says to ask an operator on its page, in the list of unknown rows and in its run's trace."""
    from evq.ops.app.labels import NEXT_ACTION_LABELS

    [step] = unknown(db_url, hours_ago=1, run_id="run-next")
    label = NEXT_ACTION_LABELS["ask_operator"]
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        page = web.get(f"/ops/steps/{step.id}").text
        listed = web.get("/ops/unknown").text
        trace = web.get("/ops/runs/run-next").text
    shown = re.search(r'<dd id="next-action" data-next-action="(\w+)">(.*?)</dd>', page, flags=re.S)
    assert shown is not None and shown[1] == "ask_operator" and html_lib.unescape(shown[2]) == label
    cells = re.findall(r'<td class="next-action" data-next-action="(\w+)">(.*?)</td>', trace)
    assert [(a, html_lib.unescape(t)) for a, t in cells] == [("ask_operator", label)]
    # The unknown list says it once when every row's next action is the same (one line a row).
    once = re.findall(r'<p class="next-action" id="next-action-all" data-next-action="(\w+)">(.*?)</p>', listed)
    assert [(a, html_lib.unescape(t)) for a, t in once] == [("ask_operator", label)]
