"""The operator's desk (issue 34): a close has no default verdict (the browser will not submit
one without it, the server refuses one posted without it and closes nothing). Real `evq serve`
and real PostgreSQL; the browser parts in real headless Chromium with axe-core.

Screenshots land in $EVQ_TEST_ARTIFACTS/operator-desk (default: test-artifacts/operator-desk at
the repository's root), one per page, named for the page."""

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
