"""Quality a user sees, in real headless Chromium: every page of /ops, at 1280x900 and at a
phone's 390x844, is screenshotted, checked by axe-core (no serious or critical violation) and
readable (no sideways scroll of the whole page: wide tables scroll in their own box); and an
operator with only a keyboard signs in, finds a recipient's row, filters and closes it.

axe-core runs inside each page: injected through WebDriver (`execute_script`), which evaluates in
the page's own context. The page's CSP (`default-src 'none'`) forbids the page's own scripts,
not WebDriver's, so this test needs no CSP bypass and keeps the policy the operators get.
Artifacts: test-artifacts/ops-page/<page>-1280.png and -narrow.png, axe/<page>.json, axe-report.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import make_key
from tests.support import held_steps, serve_process, unknown_steps, valid, with_store
from tests.web import axe_check
from tests.web.support import chromium
from tests.web.test_ops_page import absent, click_and_load, fill_verdict

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "ops-page"
SIZES = {"1280": (1280, 900), "narrow": (390, 844)}
# The step list's tabs and how many of demo_data's rows each shows (before the test's bulk actions).
TABS = {"all": 11, "held": 1, "pending": 3, "in_flight": 0, "retryable": 0, "unknown": 4, "accepted": 2, "rejected": 1}
HTML_BODY = (
    "<html><body><h1 style='color:#0b5'>Your December invoice</h1><p>Hello Dana,</p>"
    "<p>your invoice <b>INV-2026-1207</b> for <b>€ 1,240.00</b> is attached.</p>"
    "<p><a href='https://billing.example/inv/1207'>View it online</a></p></body></html>"
)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium for the module: starting it is the slow part of a browser test."""
    # before Chromium starts: a missing axe-core skips or fails right away
    axe_check.axe_source()
    with chromium(tmp_path_factory.mktemp("chromium"), "--hide-scrollbars", "--window-size=1280,900") as chrome:
        yield chrome


@pytest.fixture
def server(db_url: str, driver: Any) -> Iterator[str]:
    """`evq serve` for this test's database; the browser forgets the previous test's session
    (cookies are per host, not per port, and every test's server is on 127.0.0.1)."""
    driver.delete_all_cookies()
    resize(driver, "1280")
    with serve_process(db_url) as served:
        yield served.url


def resize(driver: Any, size: str) -> None:
    """The viewport exactly (a window size would include the browser's own frame). Not as a
    phone (`mobile`): a phone zooms a too-wide page out to fit, which would hide the very
    sideways scroll the narrow check looks for."""
    width, height = SIZES[size]
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )


def demo_data(db_url: str) -> dict[str, int]:
    """What an on-call operator finds on a normal bad day: unknown rows of a few runs, a held
    send, accepted and rejected ones, a pending backlog."""
    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Accepted, Rejected
    from evq.worker.transitions import decide

    now = datetime.now(UTC)

    async def settle(store: Any, outcome: Any, **request: Any) -> int:
        made = await store.enqueue(valid(**request), now=now - timedelta(minutes=40))
        [claimed] = await store.claim(
            owner="w-1",
            providers=["smtp"],
            limit=1,
            lease_seconds=60,
            dedupe_windows={},
            now=now - timedelta(minutes=39),
        )
        settled = decide(claimed, outcome, default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False)
        await store.record([settled], actor="w-1", now=now - timedelta(minutes=39))
        return int(made.id)

    async def go(store: Any) -> dict[str, int]:
        made: dict[str, int] = {}
        made["fabrikam_sent"] = await settle(
            store,
            Accepted("0100018c-2f1e-4c11"),
            run_id="billing-2026-12",
            step_id="invoice-fabrikam",
            to=["billing@fabrikam.example"],
            subject="Your December invoice INV-2026-1188",
        )
        made["accepted"] = await settle(
            store,
            Accepted("0100018c-2f1e-4c7a"),
            run_id="billing-2026-12",
            step_id="invoice-dana",
            to=["Dana Whitfield <dana@northwind.example>"],
            subject="Your December invoice INV-2026-1207",
            text="Hello Dana,\n\nyour invoice INV-2026-1207 for EUR 1,240.00 is attached.\n",
            html=HTML_BODY,
        )
        await settle(
            store,
            Rejected("550 5.1.1 mailbox unavailable"),
            run_id="billing-2026-12",
            step_id="invoice-old",
            to=["ap@closed-company.example"],
            subject="Your December invoice INV-2026-1199",
        )
        unknown = []
        for hours, run, to, subject in (
            (5.2, "onboarding-week-49", "sam.keller@fabrikam.example", "Welcome aboard, Sam"),
            (3.1, "onboarding-week-49", "li.wei@contoso.example", "Welcome aboard, Li"),
            (1.4, "renewals-q1", "priya@tailspin.example", "Your plan renews on 1 January"),
            (0.6, "renewals-q1", "ops@tailspin.example", "Renewal reminder: 30 days left"),
        ):
            [step] = await unknown_steps(store, now=now - timedelta(hours=hours), run_id=run, to=[to], subject=subject)
            unknown.append(step.id)
        made["unknown"] = unknown[0]
        made["unknown_last"] = unknown[-1]
        [held] = await held_steps(
            store,
            now=now - timedelta(minutes=25),
            run_id="collections-7",
            to=["Marta Ruiz <marta.ruiz@wingtip.example>"],
            subject="Final notice before your account is suspended",
            text="Dear Marta,\n\nyour account is 60 days overdue.\n",
        )
        made["held"] = held.id
        for n in range(3):
            await store.enqueue(
                valid(run_id="digest-daily", to=[f"reader{n}@lists.example"], subject="Today's digest"),
                now=now - timedelta(minutes=12),
            )
        return made

    return with_store(db_url, go)  # type: ignore[no-any-return]


def focus_shown(driver: Any) -> str:
    """What is focused, asserting a person can see it: on screen and drawn with an outline."""
    state = driver.execute_script(
        "const e = document.activeElement, s = getComputedStyle(e), r = e.getBoundingClientRect();"
        "return {tag: e.tagName, id: e.id, name: e.name || '', text: (e.innerText || e.value || '').slice(0, 60),"
        " outline: s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 2, shadow: s.boxShadow !== 'none',"
        " onscreen: r.width > 0 && r.height > 0 && r.bottom > 0 && r.top < innerHeight && r.right > 0 && r.left < innerWidth}"
    )
    where = f"{state['tag']}#{state['id']} {state['name']} {state['text']!r}"
    assert state["tag"] != "BODY", "focus fell back to the page"
    assert state["outline"] or state["shadow"], f"focus is not visible on {where}"
    assert state["onscreen"], f"the focused {where} is off screen"
    return where


def tab_to(driver: Any, wanted: Callable[[Any], bool], *, back: bool = False, limit: int = 60) -> None:
    """Press Tab (Shift+Tab) until the focused element is the wanted one, checking every stop."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    for _ in range(limit):
        if back:
            ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.TAB).key_up(Keys.SHIFT).perform()
        else:
            ActionChains(driver).send_keys(Keys.TAB).perform()
        focus_shown(driver)
        if wanted(driver.switch_to.active_element):
            return
    raise AssertionError(f"{limit} tabs did not reach the element")


def in_form(driver: Any, element: Any, form_id: str) -> bool:
    """Whether the element belongs to that form (the header has a field of the same name)."""
    return bool(
        driver.execute_script("return arguments[0].form && arguments[0].form.id === arguments[1]", element, form_id)
    )


def keys(driver: Any, *typed: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).send_keys(*typed).perform()


def press_and_load(driver: Any, *typed: str) -> None:
    """Press keys that load a new page (Enter on a link or button), and wait until it has."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    keys(driver, *typed)
    WebDriverWait(driver, 20).until(expected_conditions.staleness_of(old))


class Checker:
    """Each page at each size: a screenshot, axe's results, and the sideways-scroll check;
    every finding is kept, so one run lists them all."""

    def __init__(self, driver: Any):
        self.driver = driver
        self.results: dict[str, dict[str, Any]] = {}
        self.findings: list[str] = []

    def page(self, name: str) -> None:
        for size in SIZES:
            resize(self.driver, size)
            label = f"{name}-{size}"
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            assert self.driver.save_screenshot(str(ARTIFACTS / f"{label}.png"))
            results = axe_check.run_axe(self.driver)
            axe_check.write(results, ARTIFACTS / "axe" / f"{label}.json")
            self.results[label] = results
            self.findings += [f"{label}: {line}" for line in axe_check.failing(results)]
            # The scroll widths, and (to say what to fix) the innermost elements that stick out.
            wide = self.driver.execute_script(
                "const out = e => !e.closest('.table-wrap') && (e.getBoundingClientRect().right > innerWidth + 1"
                " || (e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === 'visible'));"
                "return [document.scrollingElement.scrollWidth, innerWidth,"
                " [...document.body.querySelectorAll('*')].filter(e => out(e) && ![...e.children].some(out))"
                " .slice(0, 3).map(e => e.tagName + (e.id ? '#' + e.id : '') + (e.className ? '.' + e.className : ''))]"
            )
            if wide[0] > wide[1] + 1:
                self.findings.append(f"{label}: the page scrolls sideways ({wide[0]} px > {wide[1]} px): {wide[2]}")
        resize(self.driver, "1280")


def readme_image(driver: Any) -> None:
    """The README's picture of the overview: 1280 px wide, down to the end of its pictures (at most 1400 px),
    into test-artifacts/ops-page/readme-ops-overview.png; with EVQ_UPDATE_README_IMAGE=1 also
    docs/images/ops-overview.png (how it is regenerated: the test owns what it shows)."""
    import base64
    import os

    # Down to the end of the pictures (the overview's point), else the page, at most 1400 px.
    height = min(
        int(
            driver.execute_script(
                "const p = document.getElementById('pictures');"
                "return p ? p.getBoundingClientRect().bottom + scrollY + 16 : document.scrollingElement.scrollHeight"
            )
        ),
        1400,
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": 1280, "height": height, "scale": 1},
        },
    )
    png = base64.b64decode(shot["data"])
    assert png.startswith(b"\x89PNG") and len(png) < 300_000, len(png)
    (ARTIFACTS / "readme-ops-overview.png").write_bytes(png)
    if os.environ.get("EVQ_UPDATE_README_IMAGE") == "1":
        (ROOT / "docs" / "images").mkdir(parents=True, exist_ok=True)
        (ROOT / "docs" / "images" / "ops-overview.png").write_bytes(png)


# Slow (tens of seconds loaded): started first under xdist (tests/conftest.py), not in a run's last minute.
@pytest.mark.slow
def test_every_page_is_accessible_and_readable_at_1280_and_narrow(server, driver, db_url):
    """Login, overview, the unknown queue, each state's tab of the step list, search results, a step
    (unknown, held, accepted with an HTML email), a trace, the held queue, both bulk forms' preview
    and result, and an error page, in one browser session."""
    from selenium.webdriver.common.by import By

    made = demo_data(db_url)
    check = Checker(driver)

    driver.get(server + "/ops")
    assert driver.current_url.endswith("/ops/login")
    check.page("login")
    driver.find_element(By.ID, "key").send_keys(make_key(db_url, "alice", "operator"))
    click_and_load(driver, driver.find_element(By.ID, "sign-in"))
    assert driver.find_element(By.ID, "who").text.startswith("alice")
    check.page("overview")
    readme_image(driver)

    driver.get(server + "/ops/unknown")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#unknown-rows tbody tr[data-step]")) == 4
    check.page("unknown-queue")

    # Each state's tab of the step list (demo_data has rows in all but in_flight and retryable).
    for tab, n in TABS.items():
        driver.get(server + f"/ops/steps?status={tab}")
        assert driver.find_element(By.ID, f"tab-{tab}").get_attribute("aria-current") == "page"
        # An empty tab asked once, the tab's page being there: an empty find_elements waits out the
        # driver's implicit 10 s (20 s of this test, for in_flight and retryable).
        rows = "#step-rows tbody tr[data-step]"
        assert len(driver.find_elements(By.CSS_SELECTOR, rows)) == n if n else absent(driver, By.CSS_SELECTOR, rows), (
            tab
        )
        check.page(f"list-{tab}")

    driver.get(server + "/ops/steps?q=@tailspin.example")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr[data-step]")) == 2
    check.page("search-results")

    for name, step in (("step-unknown", "unknown"), ("step-held", "held"), ("step-accepted", "accepted")):
        driver.get(server + f"/ops/steps/{made[step]}")
        assert driver.find_element(By.ID, "status").text == step
        check.page(name)

    driver.get(server + "/ops/runs/onboarding-week-49")
    assert len(driver.find_elements(By.CSS_SELECTOR, "#trace tbody tr")) >= 8
    check.page("trace")

    driver.get(server + "/ops/held")
    assert driver.find_element(By.ID, f"held-{made['held']}")
    check.page("held")

    driver.get(server + "/ops/unknown?run_id=renewals-q1")
    fill_verdict(driver.find_element(By.ID, "bulk-form"), "rejected", "provider outage 02:10-02:40, resent by hand")
    click_and_load(driver, driver.find_element(By.ID, "bulk-preview"))
    assert driver.find_element(By.ID, "preview-count").text.startswith("2 unknown rows would become rejected")
    check.page("unknown-bulk-preview")
    click_and_load(driver, driver.find_element(By.ID, "bulk-confirm"))
    assert driver.find_element(By.TAG_NAME, "h1").text == "Bulk close: 2 closed, 0 failed"
    check.page("unknown-bulk-closed")

    # The step list's bulk form, open (it is closed by default), its preview and its result.
    driver.get(server + "/ops/steps?status=pending&run_id=digest-daily")
    driver.find_element(By.CSS_SELECTOR, "#bulk summary").click()
    check.page("list-bulk-form")
    form = driver.find_element(By.ID, "bulk-form")
    form.find_element(By.CSS_SELECTOR, "input[value=cancel]").click()
    form.find_element(By.NAME, "note").send_keys("the digest went out twice yesterday; skip today's")
    click_and_load(driver, driver.find_element(By.ID, "bulk-preview"))
    assert "3 rows would be cancelled" in driver.find_element(By.ID, "preview-count").text
    check.page("bulk-preview")
    click_and_load(driver, driver.find_element(By.ID, "bulk-confirm"))
    assert "Bulk cancel: 3 done, 0 not done" in driver.find_element(By.ID, "bulk-summary").text
    check.page("bulk-done")

    driver.get(server + "/ops/steps/987654321")
    assert "404" in driver.find_element(By.TAG_NAME, "h1").text, driver.page_source[:3000]
    check.page("error")

    axe_check.report(check.results, ARTIFACTS / "axe-report.md")
    assert len(check.results) == 2 * (15 + len(TABS))
    assert not check.findings, "\n".join(check.findings)


def test_an_operator_with_only_a_keyboard_finds_filters_and_closes_a_row(server, driver, db_url):
    """Tab, Shift+Tab, Enter, Space and typing only, no click: sign in, take the skip links (to the content,
    to the search box), search for a recipient's domain, pick the unknown tab, filter by run, open
    the result and close it with a verdict and a note. At each stop the focused element is on
    screen and drawn with an outline."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    made = demo_data(db_url)
    key = make_key(db_url, "kim", "operator")
    driver.get(server + "/ops")
    tab_to(driver, lambda e: e.get_attribute("id") == "key")
    keys(driver, key)
    press_and_load(driver, Keys.ENTER)
    assert driver.find_element(By.ID, "who").text.startswith("kim")

    # The skip links are the first stops: to the content, then to the search box.
    keys(driver, Keys.TAB)
    assert focus_shown(driver).startswith("A#skip-to-main")
    keys(driver, Keys.TAB)
    assert focus_shown(driver).startswith("A#skip-to-search")
    keys(driver, Keys.ENTER)
    assert focus_shown(driver).startswith("INPUT#search-q")

    # Search for a recipient's domain (every state), then narrow it with a filter.
    keys(driver, "@fabrikam.example")
    press_and_load(driver, Keys.ENTER)
    assert "q=%40fabrikam.example" in driver.current_url
    listed = driver.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr[data-step]")
    assert [r.get_attribute("data-step") for r in listed] == [str(made["unknown"]), str(made["fabrikam_sent"])]
    tab_to(driver, lambda e: e.get_attribute("id") == "tab-unknown")
    press_and_load(driver, Keys.ENTER)
    tab_to(driver, lambda e: in_form(driver, e, "filters") and e.get_attribute("name") == "run_id")
    keys(driver, "onboarding-week-49")
    press_and_load(driver, Keys.ENTER)
    assert "run_id=onboarding-week-49" in driver.current_url and "status=unknown" in driver.current_url
    listed = driver.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr[data-step]")
    assert [r.get_attribute("data-step") for r in listed] == [str(made["unknown"])]

    # Open the result.
    tab_to(driver, lambda e: e.text == str(made["unknown"]))
    press_and_load(driver, Keys.ENTER)
    assert driver.find_element(By.ID, "status").text == "unknown"
    assert driver.find_element(By.ID, "subject").text == "Welcome aboard, Sam"

    # Close it: the verdict by typing into the select, the note, then the button.
    tab_to(driver, lambda e: e.get_attribute("name") == "verdict")
    keys(driver, "accepted")
    tab_to(driver, lambda e: e.get_attribute("name") == "note")
    keys(driver, "found in the provider's log, delivered 02:31")
    tab_to(driver, lambda e: e.get_attribute("id") == "close")
    # Shift+Tab goes back through the form and Tab returns to the button: the order is the page's.
    tab_to(driver, lambda e: e.get_attribute("name") == "note", back=True)
    tab_to(driver, lambda e: e.get_attribute("id") == "close")
    press_and_load(driver, Keys.SPACE)  # Space presses a button as Enter does
    assert f"closed={made['unknown']}" in driver.current_url
    assert "run_id=onboarding-week-49" in driver.current_url  # back to the filtered list
    assert driver.find_element(By.ID, "closed").text.startswith(f"Step {made['unknown']} was closed")
    from tests.support import step_row

    assert step_row(db_url, made["unknown"])["status"] == "accepted"
