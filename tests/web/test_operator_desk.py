"""The operator's desk (issue 34): a close has no default verdict (the browser will not submit
one without it, the server refuses one posted without it and closes nothing). Real `evq serve`
and real PostgreSQL; the browser parts in real headless Chromium with axe-core.

Screenshots land in $EVQ_TEST_ARTIFACTS/operator-desk (default: test-artifacts/operator-desk at
the repository's root), one per page, named for the page: overview, unknown-list (and its
preview, closed and live states), step, run-timeline, held-inbox (and held-correct), search;
each page's axe-core results beside them in axe/."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.conftest import make_key
from tests.support import rows, serve_process, step_row
from tests.web import axe_check
from tests.web.support import chromium
from tests.web.test_ops_page import _csrf, _signed_in, sign_in
from tests.web.test_step_lists import unknown

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("EVQ_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "operator-desk"


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    with serve_process(db_url) as served:
        yield served.url


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path / "chromium", "--window-size=1400,1000") as driver:
        yield driver


def shot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def axe_clean(driver: Any, name: str) -> None:
    results = axe_check.run_axe(driver)
    axe_check.write(results, ARTIFACTS / "axe" / f"{name}.json")
    assert not axe_check.failing(results), axe_check.failing(results)


def operator_resolved(db_url: str) -> list[dict[str, Any]]:
    return rows(db_url, "SELECT * FROM evidence WHERE kind = 'operator_resolved' ORDER BY id")


def test_the_close_forms_cannot_be_submitted_without_choosing_a_verdict(server, browser, db_url):
    """On the step's close form and the unknown list's bulk form, nothing is preselected: a note
    and a click do not submit (the select is required and empty), and the row stays unknown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    [step] = unknown(db_url, run_id="run-verdict")
    sign_in(browser, server, make_key(db_url, "alice", "operator"))
    for page, form_id, button in (
        (f"/ops/steps/{step}", "close-form", "close"),
        ("/ops/unknown", "bulk-form", "bulk-preview"),
        ("/ops/steps?status=unknown", "bulk-form", "bulk-preview"),
    ):
        browser.get(server + page)
        if form_id == "bulk-form" and page.startswith("/ops/steps"):
            browser.find_element(By.CSS_SELECTOR, "#bulk summary").click()
        form = browser.find_element(By.ID, form_id)
        select = form.find_element(By.NAME, "verdict")
        assert Select(select).first_selected_option.get_attribute("value") == "", page
        assert select.get_attribute("required") is not None, page
        form.find_element(By.NAME, "note").send_keys("checked the log")
        browser.find_element(By.ID, button).click()
        # The browser refused the submit: still the same page, the select reports a missing value.
        assert browser.execute_script("return arguments[0].validity.valueMissing", select), page
        assert browser.find_element(By.ID, form_id).is_displayed() and page.split("?")[0] in browser.current_url
        axe_clean(browser, "close-form" + page.replace("/", "-").replace("?", "-").replace("=", "-"))
    shot(browser, "close-form-no-verdict")
    assert step_row(db_url, step)["status"] == "unknown" and not operator_resolved(db_url)


def test_a_close_posted_without_a_verdict_is_refused_and_closes_nothing(server, db_url):
    """Over plain HTTP, as a script or an old form would post it: every close endpoint answers
    400 naming the verdict, and no row changes."""
    ids = unknown(db_url, 2, run_id="run-noverdict")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/unknown").text)
        note = {"csrf": token, "note": "checked the provider log"}
        posts = (
            (f"/ops/steps/{ids[0]}/close", note),
            (f"/ops/steps/{ids[0]}/close", {**note, "verdict": " "}),
            ("/ops/unknown/preview", {**note, "run_id": "run-noverdict"}),
            ("/ops/unknown/close", {**note, "ids": ",".join(map(str, ids)), "seal": "x", "versions": ""}),
            ("/ops/bulk/preview", {**note, "action": "close", "status": "unknown", "run_id": "run-noverdict"}),
            ("/ops/bulk/apply", {**note, "action": "close", "seen": f"{ids[0]}:unknown", "seal": "x"}),
        )
        for path, data in posts:
            answer = web.post(path, data=data)
            assert answer.status_code == 400, (path, answer.status_code, answer.text[-800:])
            assert "verdict" in answer.text and "no default" in answer.text, path
    assert {step_row(db_url, i)["status"] for i in ids} == {"unknown"}
    assert not operator_resolved(db_url)


def test_a_bad_list_parameter_is_a_400_with_the_reason_never_ignored(server, db_url):
    """A mistyped filter would show every row as if it had matched: each list refuses an unknown
    parameter name and a value it cannot read, naming the field."""
    unknown(db_url, 1, run_id="run-params")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        for path, field in (
            ("/ops/unknown?runid=run-params", "runid"),
            ("/ops/unknown?older_than=soon", "older_than"),
            ("/ops/unknown?offset=ten", "offset"),
            ("/ops/unknown?expand=yes", "expand"),
            ("/ops/steps?status=unknown&colour=red", "colour"),
            ("/ops/steps?status=lost", "status"),
            ("/ops/steps?offset=-1", "offset"),
            ("/ops/steps?older_than=3x", "older_than"),
            ("/ops/held?page=2", "page"),
            ("/ops/held?offset=x", "offset"),
            ("/ops/runs/run-params?offset=1e3", "offset"),
        ):
            answer = web.get(path)
            assert answer.status_code == 400, (path, answer.status_code, answer.text[-600:])
            assert f"<code>{field}</code>" in answer.text and 'id="error"' in answer.text, path
            assert 'data-step="' not in answer.text, path  # no rows shown as if they matched
        for fine in ("/ops/unknown?run_id=run-params&expand=1&offset=0", "/ops/steps?status=unknown&q=run-params"):
            assert web.get(fine).status_code == 200, fine


def test_the_overview_banner_speaks_of_provider_faults_and_unconfigured_providers_are_not_sending(server, db_url):
    """Unknown rows (lost replies: messages the provider may have judged) raise no "may be down"
    banner; a provider this installation does not configure is not shown as sending."""
    import re

    unknown(db_url, 3, run_id="run-lost")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        html = web.get("/ops").text
    assert "may be down" not in html and 'class="error circuit"' not in html
    states = dict(re.findall(r'<tr id="provider-([a-z]+)">.*?<td class="circuit-state">([^<]*)</td>', html, flags=re.S))
    assert states["smtp"] == "sending", states
    others = {p: s for p, s in states.items() if p != "smtp"}
    assert others and all(s.startswith("not configured here") for s in others.values()), states


def test_an_operator_picks_20_of_50_unknown_rows_and_closes_exactly_those(server, browser, db_url):
    """The desk's first job: 50 rows whose replies were lost (taken to unknown as the worker
    takes them); the operator ticks 20 boxes, previews, closes them as rejected with a note. The
    other 30 stay unknown; each closed row's evidence names the operator and the note."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests.web.test_ops_page import click_and_load

    ids = unknown(db_url, 50, run_id="run-desk")
    sign_in(browser, server, make_key(db_url, "alice", "operator"))
    browser.get(server + "/ops/unknown?run_id=run-desk")
    table = browser.find_element(By.ID, "unknown-rows")
    listed = [int(r.get_attribute("data-step")) for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert sorted(listed) == sorted(ids)
    # One line a row: its Message-ID, and the age as a <time> with the exact instant.
    first = table.find_element(By.CSS_SELECTOR, f'tr[data-step="{ids[0]}"]')
    assert first.find_element(By.CSS_SELECTOR, "td.message-id").text.startswith("<")
    age = first.find_element(By.CSS_SELECTOR, "td.age time")
    assert age.get_attribute("datetime") and "UTC" in age.get_attribute("title")
    heights = {r.size["height"] for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")}
    assert max(heights) < 2 * min(heights), heights  # no row wraps to three lines
    axe_clean(browser, "unknown-list")
    shot(browser, "unknown-list")

    # The header box ticks every row on the page at once (and clears them again).
    header = browser.find_element(By.ID, "pick-all")
    header.click()
    assert all(b.is_selected() for b in browser.find_elements(By.CSS_SELECTOR, "input.pick"))
    header.click()
    assert not any(b.is_selected() for b in browser.find_elements(By.CSS_SELECTOR, "input.pick"))

    chosen = listed[5:25]
    for step in chosen:
        browser.find_element(By.CSS_SELECTOR, f'input.pick[value="{step}"]').click()
    form = browser.find_element(By.ID, "bulk-form")
    Select(form.find_element(By.NAME, "verdict")).select_by_value("rejected")
    form.find_element(By.NAME, "note").send_keys("bounced per the relay log, 20 checked by hand")
    click_and_load(browser, browser.find_element(By.ID, "bulk-preview-picked"))
    assert browser.find_element(By.ID, "preview-count").text.startswith("20 unknown rows would become rejected")
    previewed = [int(td.text) for td in browser.find_elements(By.CSS_SELECTOR, "#preview-rows tbody tr td:first-child")]
    assert sorted(previewed) == sorted(chosen)
    assert {step_row(db_url, i)["status"] for i in ids} == {"unknown"}  # a preview changes nothing
    axe_clean(browser, "unknown-preview")
    shot(browser, "unknown-preview")
    click_and_load(browser, browser.find_element(By.ID, "bulk-confirm"))
    assert browser.find_element(By.TAG_NAME, "h1").text == "Bulk close: 20 closed, 0 failed"
    axe_clean(browser, "unknown-closed")
    shot(browser, "unknown-closed")

    status = {i: step_row(db_url, i)["status"] for i in ids}
    assert {i for i, s in status.items() if s == "rejected"} == set(chosen)
    assert [i for i, s in status.items() if s == "unknown"] == [i for i in ids if i not in chosen]
    evidence = operator_resolved(db_url)
    assert sorted(e["step_id"] for e in evidence) == sorted(chosen)
    assert {e["actor"] for e in evidence} == {"alice"}
    assert {e["detail"]["note"] for e in evidence} == {"bounced per the relay log, 20 checked by hand"}


def test_picking_works_without_javascript_and_picking_nothing_is_refused(server, db_url):
    """The same close over plain HTTP (no script): the "tick every row" link renders every box
    ticked; a preview of picked rows with none picked is a 400, not every row."""
    import re

    ids = unknown(db_url, 3, run_id="run-nojs")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        page = web.get("/ops/unknown?run_id=run-nojs&pick=page").text
        ticked = re.findall(r'name="pick" value="(\d+)" form="bulk-form" class="pick" aria-label="[^"]*" checked', page)
        assert sorted(map(int, ticked)) == sorted(ids)
        token = _csrf(page)
        form = {"csrf": token, "verdict": "rejected", "note": "n", "run_id": "run-nojs", "scope": "picked"}
        none = web.post("/ops/unknown/preview", data=form)
        assert none.status_code == 400 and "<code>pick</code>" in none.text
        two = web.post("/ops/unknown/preview", data={**form, "pick": [str(ids[0]), str(ids[2])]})
        assert two.status_code == 200 and "<strong>2</strong> unknown rows would become" in two.text
    assert {step_row(db_url, i)["status"] for i in ids} == {"unknown"}


def test_the_unknown_list_and_the_overview_update_while_open(server, browser, db_url):
    """A new unknown row appears on the open list without a reload, ticked boxes stay ticked,
    and the page says what changed since it was opened; the overview's counts follow too."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    first = unknown(db_url, 2, run_id="run-live")
    sign_in(browser, server, make_key(db_url, "alice", "operator"))
    browser.get(server + "/ops/unknown?run_id=run-live")
    browser.find_element(By.CSS_SELECTOR, f'input.pick[value="{first[0]}"]').click()
    marker = browser.execute_script("window.__not_reloaded = true; return window.__not_reloaded")
    assert marker is True
    [arrived] = unknown(db_url, 1, run_id="run-live")

    def listed(driver: Any) -> list[int]:
        return [
            int(r.get_attribute("data-step")) for r in driver.find_elements(By.CSS_SELECTOR, "#unknown-rows tbody tr")
        ]

    WebDriverWait(browser, 60).until(lambda d: arrived in listed(d))
    assert browser.execute_script("return window.__not_reloaded") is True  # the same page, not a reload
    assert browser.find_element(By.CSS_SELECTOR, f'input.pick[value="{first[0]}"]').is_selected()
    assert "1 new row since you opened this page" in browser.find_element(By.ID, "live-status").text
    assert "3 unknown rows match" in browser.find_element(By.ID, "total").text
    axe_clean(browser, "unknown-live")
    shot(browser, "unknown-live")

    browser.get(server + "/ops")
    before = int(browser.find_element(By.CSS_SELECTOR, 'td[data-count="unknown"]').text)
    browser.execute_script("window.__not_reloaded = true")
    unknown(db_url, 1, run_id="run-live")
    WebDriverWait(browser, 90).until(
        lambda d: int(d.find_element(By.CSS_SELECTOR, 'td[data-count="unknown"]').text) == before + 1
    )
    assert browser.execute_script("return window.__not_reloaded") is True
    assert "unknown +1 since you opened this page" in browser.find_element(By.ID, "live-status").text
    axe_clean(browser, "overview")
    shot(browser, "overview")


def test_an_approver_picks_held_sends_in_the_inbox_and_approves_them_at_once(server, browser, db_url):
    """The held queue as an inbox: each send's HTML rendered in a sandboxed frame, a box each; the
    approver picks two of three, previews, approves exactly those, then corrects the third's
    subject and HTML in the inbox and approves it. The pages an operator works through (step with
    its timeline, run trace, a subject search) are axe-clean too, and each is saved as a screenshot."""
    from selenium.webdriver.common.by import By

    from tests.web.test_ops_page import click_and_load
    from tests.web.test_step_lists import held

    ids = held(db_url, 3, run_id="run-inbox", html="<p>Hello <b>there</b></p>")
    sign_in(browser, server, make_key(db_url, "alice", "operator"))
    browser.get(server + "/ops/held")
    frame = browser.find_element(By.ID, f"html-part-{ids[0]}")
    assert frame.get_attribute("sandbox") == ""  # rendered, and nothing in it may run
    axe_clean(browser, "held-inbox")
    shot(browser, "held-inbox")
    for step in ids[:2]:
        browser.find_element(By.CSS_SELECTOR, f'input.pick[value="{step}"]').click()
    browser.find_element(By.CSS_SELECTOR, "#bulk summary").click()
    form = browser.find_element(By.ID, "bulk-form")
    form.find_element(By.CSS_SELECTOR, "input[value=approve]").click()
    form.find_element(By.NAME, "note").send_keys("both checked against the campaign brief")
    click_and_load(browser, browser.find_element(By.ID, "bulk-preview-picked"))
    assert "2 rows would be approved" in browser.find_element(By.ID, "preview-count").text
    axe_clean(browser, "held-preview")
    click_and_load(browser, browser.find_element(By.ID, "bulk-confirm"))
    assert "Bulk approve: 2 done, 0 not done" in browser.find_element(By.ID, "bulk-summary").text
    assert [step_row(db_url, i)["status"] for i in ids] == ["pending", "pending", "held"]
    approved = rows(db_url, "SELECT step_id, actor FROM evidence WHERE kind = 'approved' ORDER BY step_id")
    assert [(r["step_id"], r["actor"]) for r in approved] == [(ids[0], "alice"), (ids[1], "alice")]

    for name, path in (
        ("step", f"/ops/steps/{ids[2]}"),
        ("run-timeline", "/ops/runs/run-inbox"),
        ("search", "/ops/steps?q=run-inbox&subject=subject"),
    ):
        browser.get(server + path)
        if name == "search":  # the subject filter finds the run's three sends, newest first, and says how far it read
            assert "Searched all" in browser.find_element(By.ID, "subject-scanned").text
            assert [
                r.get_attribute("data-step") for r in browser.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr")
            ] == [str(i) for i in sorted(ids, reverse=True)]
        if name == "step":  # its timeline, readable without a click (the screenshot shows it)
            timeline = browser.find_element(By.ID, "timeline")
            assert timeline.find_elements(By.CSS_SELECTOR, "ol.events.recent li")
            browser.execute_script("arguments[0].scrollIntoView()", timeline)
        axe_clean(browser, name)
        shot(browser, name)

    # The last held send, corrected and approved from the inbox in the browser (a plain form).
    browser.get(server + "/ops/held")
    browser.find_element(By.CSS_SELECTOR, f"#correct-{ids[2]} summary").click()
    form = browser.find_element(By.ID, f"correct-form-{ids[2]}")
    form.find_element(By.NAME, "note").send_keys("greeting fixed")
    form.find_element(By.NAME, "subject").send_keys("Hello, corrected")
    html = form.find_element(By.NAME, "html")
    html.clear()
    html.send_keys("<p>Hello <b>you</b></p>")
    browser.execute_script("arguments[0].scrollIntoView()", form)
    axe_clean(browser, "held-correct")
    shot(browser, "held-correct")
    click_and_load(browser, browser.find_element(By.ID, f"correct-approve-{ids[2]}"))
    assert "Approved" in browser.find_element(By.ID, "approved").text
    corrected = step_row(db_url, ids[2])
    assert corrected["status"] == "pending" and corrected["payload"]["subject"] == "Hello, corrected"
    assert corrected["payload"]["html"] == "<p>Hello <b>you</b></p>"


def test_a_runs_timeline_groups_events_by_step_on_one_axis_and_collapses_the_earlier_ones(server, db_url):
    """Each step of the run is a group: its events placed on the run's time axis (0 to 100), the
    latest three listed, the earlier ones inside a closed <details>; the flat timeline stays."""
    import re

    ids = unknown(db_url, 2, run_id="run-groups")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        html = web.get("/ops/runs/run-groups").text
    assert 'id="trace"' in html  # the flat timeline is still there
    for step in ids:
        group = re.search(rf'<section class="step-group" id="group-{step}".*?</section>', html, flags=re.S)
        assert group, step
        body = group[0]
        recent = re.search(r'<ol class="events recent">(.*?)</ol>', body, flags=re.S)[1]
        assert recent.count("<li") == 3
        earlier = re.search(
            r'<details class="earlier"><summary>(\d+) earlier events?</summary>(.*?)</details>', body, flags=re.S
        )
        assert earlier and int(earlier[1]) == earlier[2].count("<li") >= 1
        xs = [float(x) for x in re.findall(r'<rect x="([\d.]+)"', body)]
        assert xs and all(0 <= x <= 100 for x in xs) and len(xs) == 3 + int(earlier[1])


def test_a_subject_search_finds_what_the_operator_typed_on_the_page_the_api_and_the_cli(server, db_url):
    """Search by subject: a case-insensitive substring, on top of the other filters; the page,
    GET /v1/steps and `evq steps list` give the same rows newest first and say how many steps
    they read; a bulk close over the filter previews exactly those rows."""
    import re

    from tests.acceptance.conftest import Evq
    from tests.web.support import checked

    refunds = unknown(db_url, 3, run_id="run-subject", subject="Refund for order 4411")
    welcome = unknown(db_url, 2, run_id="run-subject", subject="Welcome aboard")
    unknown(db_url, 1, run_id="run-elsewhere", subject="refund elsewhere")
    newest_first = sorted(refunds, reverse=True)
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        for path in (
            "/ops/steps?subject=REFUND&run_id=run-subject",
            "/ops/steps?status=unknown&subject=order+44&run_id=run-subject",
            "/ops/unknown?subject=refund+FOR&run_id=run-subject",
        ):
            page = web.get(path)
            assert page.status_code == 200, (path, page.text[-600:])
            listed = [int(i) for i in re.findall(r'<tr[^>]* data-step="(\d+)"', page.text)]
            assert listed == newest_first, (path, listed)
            assert 'id="subject-scanned"' in page.text and "Searched all 5 steps" in page.text, (
                path
            )  # the run's, none cut
        token = _csrf(web.get("/ops/unknown?subject=refund&run_id=run-subject").text)
        preview = web.post(
            "/ops/unknown/preview",
            data={"csrf": token, "verdict": "rejected", "note": "n", "run_id": "run-subject", "subject": "refund"},
        )
        assert preview.status_code == 200 and "<strong>3</strong> unknown rows would become" in preview.text
        too_long = web.get("/ops/steps?subject=" + "x" * 201)
        assert too_long.status_code == 400 and "<code>subject</code>" in too_long.text

        reader = make_key(db_url, "bot", "agent")
        api = checked(
            web.get("/v1/steps", params={"subject": "refund", "run_id": "run-subject"}, headers=bearer(reader))
        )
        assert [s["id"] for s in api["data"]] == newest_first
        assert api["meta"]["total"] == 3 and api["meta"]["total_exact"] is True
        assert api["meta"]["subject_scanned"] == 5  # every step of the run, none cut
    cli = Evq(db_url).json("steps", "list", "--subject", "Refund", "--run-id", "run-subject")
    assert [s["id"] for s in cli["data"]] == newest_first and cli["meta"]["subject_scanned"] == 5
    assert {step_row(db_url, i)["status"] for i in refunds + welcome} == {"unknown"}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_apis_lists_answer_a_bad_query_parameter_with_400_and_the_reason(server, db_url):
    """The /v1 lists, as the page: a parameter a list does not take, or a value it cannot read,
    is a 400 in the contract's error shape naming the field, never a list read without it.
    A path parameter's error stays 422 (it is not a filter)."""
    from tests.web.support import checked

    unknown(db_url, 1, run_id="run-api400")
    key = bearer(make_key(db_url, "alice", "operator"))
    with httpx.Client(base_url=server, timeout=30) as web:
        for path, field in (
            ("/v1/steps?colour=red", "colour"),
            ("/v1/steps?runid=run-api400", "runid"),
            ("/v1/steps?status=lost", "status.0"),
            ("/v1/steps?older_than=3x", "older_than"),
            ("/v1/steps?limit=ten", "limit"),
            ("/v1/steps?subject=" + "x" * 201, "subject"),
            ("/v1/steps?q=a&search=b", "q"),
            ("/v1/refusals?colour=red", "colour"),
            ("/v1/refusals?limit=0", "limit"),
            ("/v1/events?offset=x", "offset"),
            ("/v1/deliveries?bogus=1", "bogus"),
            ("/v1/runs/run-api400?offset=1e3", "offset"),
            ("/v1/steps/1?wait=forever", "wait"),
        ):
            answer = web.get(path, headers=key)
            assert answer.status_code == 400, (path, answer.status_code, answer.text[:400])
            body = checked(answer)
            assert body["status"] == "error" and body["error"]["code"] == "E_INVALID_ARG", path
            fields = body["error"]["context"]["fields"]
            assert fields[0]["field"] == field and fields[0]["message"], (path, fields)
            assert field in body["error"]["message"], path
        path_error = web.get("/v1/steps/abc", headers=key)
        assert (
            path_error.status_code == 422 and checked(path_error)["error"]["context"]["fields"][0]["field"] == "step_id"
        )


def test_a_steps_page_shows_its_events_on_a_time_axis_the_latest_five_open(server, db_url):
    """The step page's timeline: a step tried twice (a temporary failure, then a lost answer)
    has six events; the latest five are listed, the first folded in a closed <details>, each
    placed on the step's own axis (0 to 100). Plain HTML: no script is needed to read it."""
    import re

    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Unknown
    from evq.worker.transitions import decide
    from tests.support import with_store
    from tests.web.test_step_lists import after_one_try

    [step] = after_one_try(db_url, 1, max_attempts=3, run_id="run-axis")

    async def lose_the_second_answer(store: Any) -> None:
        [claimed] = await store.claim(
            owner="w-test", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=None
        )
        assert claimed.id == step
        lost = decide(claimed, Unknown("lost"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
        await store.record([lost], actor="w-test", now=None)

    with_store(db_url, lose_the_second_answer)
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        page = web.get(f"/ops/steps/{step}").text
    section = re.search(r'<section class="step-timeline" id="timeline".*?</section>', page, flags=re.S)
    assert section, page[-2000:]
    body = section[0]
    recent = re.search(r'<ol class="events recent">(.*?)</ol>', body, flags=re.S)[1]
    kinds = re.findall(r'data-kind="([a-z_]+)"', recent)
    assert kinds == ["enqueued", "attempt_started", "provider_response", "attempt_started", "provider_response"]
    earlier = re.search(r'<details class="earlier"><summary>1 earlier event</summary>(.*?)</details>', body, flags=re.S)
    assert earlier and re.findall(r'data-kind="([a-z_]+)"', earlier[1]) == ["decision"]
    xs = [float(x) for x in re.findall(r'<rect x="([\d.]+)"', body)]
    assert len(xs) == 6 and all(0 <= x <= 100 for x in xs) and xs == sorted(xs)
    assert "<script" not in body


def test_an_approver_corrects_a_held_send_from_the_inbox_without_javascript(server, db_url):
    """The inbox's "Correct and approve": the step page's approve form on each held send (its
    HTML rendered in a sandboxed frame under a policy that loads nothing remote), posted as a
    browser without script posts it. A corrected subject and HTML go out instead and the inbox
    says so; a corrected text beside the unchanged HTML is refused and the send stays held; the
    key that enqueued a send gets no form and its post is refused (a second person decides)."""
    import html as html_lib
    import re

    from tests.support import request
    from tests.web.support import form_fields
    from tests.web.test_step_lists import held

    asked = "<p>Hello <b>there</b></p>"
    fixed, kept = held(db_url, 2, run_id="run-correct", subject="Helo", html=asked)
    admin = make_key(db_url, "root", "admin")
    with httpx.Client(base_url=server, timeout=30) as api:
        made = api.post(
            "/v1/steps", json=request(run_id="run-own", require_approval=True), headers=bearer(admin)
        ).json()
    own = made["data"]["id"]
    assert step_row(db_url, own)["status"] == "held"
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        inbox = web.get("/ops/held").text
        frame = re.search(rf'<iframe class="email-html" id="html-part-{fixed}" sandbox srcdoc="([^"]*)"', inbox)
        assert frame, inbox[-1500:]
        srcdoc = html_lib.unescape(frame[1])
        assert srcdoc.startswith('<meta http-equiv="Content-Security-Policy" content="default-src \'none\';')
        assert srcdoc.endswith(asked) and "allow-scripts" not in inbox
        assert f'id="correct-form-{fixed}"' in inbox and f'id="correct-form-{own}"' in inbox

        action = f"/ops/steps/{fixed}/approve"
        fields = form_fields(inbox, action)
        assert fields["back"] == "held" and fields["action"] == "approve"
        corrected = "<p>Hello <b>Sam</b></p>"
        done = web.post(
            action, data={**fields, "note": "typo fixed", "subject": "Hello", "text": "", "html": corrected}
        )
        assert done.status_code == 303 and done.headers["location"] == f"/ops/held?approved={fixed}", done.text[-800:]
        after = web.get(done.headers["location"])
        assert after.status_code == 200 and 'id="approved"' in after.text and "Approved" in after.text
        assert f'id="held-{fixed}"' not in after.text  # it left the inbox

        refused = web.post(
            f"/ops/steps/{kept}/approve",
            data={**form_fields(inbox, f"/ops/steps/{kept}/approve"), "note": "n", "text": "new text", "html": asked},
        )
        assert refused.status_code == 422 and "html" in refused.text, refused.text[-800:]
        # Not approved: a hand-made address claims nothing; an unreadable one is a 400.
        assert 'id="approved"' not in web.get(f"/ops/held?approved={kept}").text
        assert web.get("/ops/held?approved=abc").status_code == 400

    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, admin)
        inbox = web.get("/ops/held").text
        assert f'id="correct-form-{own}"' not in inbox and f'id="correct-form-{kept}"' in inbox
        fields = {"csrf": _csrf(inbox), "back": "held", "action": "approve", "note": "mine", "subject": "x"}
        assert web.post(f"/ops/steps/{own}/approve", data=fields).status_code == 403

    row = step_row(db_url, fixed)
    assert row["status"] == "pending" and row["payload"]["subject"] == "Hello" and row["payload"]["html"] == corrected
    assert step_row(db_url, kept)["status"] == "held" and step_row(db_url, kept)["payload"]["html"] == asked
    assert step_row(db_url, own)["status"] == "held"
    approved = rows(db_url, "SELECT step_id, actor FROM evidence WHERE kind = 'approved'")
    assert [(r["step_id"], r["actor"]) for r in approved] == [(fixed, "alice")]


async def test_an_agent_over_mcp_searches_by_subject_too(db_url):
    """MCP's evq_steps_list takes the same subject filter (its schema from the command table)."""
    import asyncio

    from tests.web.test_mcp import call, client, key

    found = await asyncio.to_thread(unknown, db_url, 2, run_id="run-mcp-subject", subject="Quarterly REPORT ready")
    await asyncio.to_thread(unknown, db_url, 1, run_id="run-mcp-subject", subject="Lunch")
    agent = await key(db_url, "bot", "agent", created_by=None)
    async with client(db_url, agent) as c:
        listed = await call(c, "evq_steps_list", {"subject": "report", "run_id": "run-mcp-subject"}, "steps.list")
        refused = await call(c, "evq_steps_list", {"subject": "x" * 201}, "steps.list")
    assert [s["id"] for s in listed["data"]] == sorted(found, reverse=True)
    assert listed["meta"]["subject_scanned"] == 3 and listed["meta"]["total_exact"] is True
    assert refused["error"]["code"] == "E_INVALID_ARG"
    assert refused["error"]["context"]["fields"][0]["field"] == "subject"
