"""The step list (/ops/steps): a tab for every state with its count, each state's columns,
the search box, and bulk actions that preview exactly the rows, need a note, say the CLI
that does the same, and act on exactly the previewed ids (a row someone else changed since
is a conflict). Real `evq serve` + httpx against real PostgreSQL; one real Chromium path."""

from __future__ import annotations

import html as html_lib
import os
import re
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from evq.worker.backoff import Backoff
from evq.worker.outcomes import Retryable
from evq.worker.resolution import Resolution
from evq.worker.transitions import decide
from tests.acceptance.conftest import make_key
from tests.support import held_steps, rows, step_row, unknown_steps, valid, with_store
from tests.web.support import form_fields
from tests.web.test_ops_page import XSS, _csrf, _signed_in, browser, click_and_load, server, shot, sign_in

__all__ = ["browser", "server"]  # fixtures the tests below use
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ago(hours: float) -> datetime:
    return datetime.now(UTC) - timedelta(hours=hours)


def pending(db_url: str, n: int = 1, **request: Any) -> list[int]:
    async def make(store: Any) -> list[int]:
        return [(await store.enqueue(valid(**request), now=ago(1))).id for _ in range(n)]

    return with_store(db_url, make)


def unknown(db_url: str, n: int = 1, **request: Any) -> list[int]:
    return [s.id for s in with_store(db_url, lambda store: unknown_steps(store, n, now=ago(2), **request))]


def held(db_url: str, n: int = 1, **request: Any) -> list[int]:
    return [s.id for s in with_store(db_url, lambda store: held_steps(store, n, now=ago(1), **request))]


def after_one_try(db_url: str, n: int, *, max_attempts: int, **request: Any) -> list[int]:
    """Steps a worker tried once and got a temporary failure: retryable, or rejected
    (attempts exhausted, a requeueable dead letter) when one attempt was all they had."""

    async def make(store: Any) -> list[int]:
        made = [await store.enqueue(valid(max_attempts=max_attempts, **request), now=ago(3)) for _ in range(n)]
        claimed = await store.claim(
            owner="w-test", providers=["smtp"], limit=n, lease_seconds=60, dedupe_windows={}, now=ago(3)
        )
        settled = [
            decide(
                c, Retryable("451 try later"), default_max_attempts=3, backoff=Backoff(1, 1), dedupe_window_open=False
            )
            for c in claimed
        ]
        await store.record(settled, actor="w-test", now=ago(3))
        return [m.id for m in made]

    return with_store(db_url, make)


def in_flight(db_url: str, **request: Any) -> int:
    async def make(store: Any) -> int:
        made = await store.enqueue(valid(**request), now=ago(1))
        await store.claim(owner="w-busy", providers=["smtp"], limit=1, lease_seconds=600, dedupe_windows={}, now=None)
        return made.id

    return with_store(db_url, make)


def accepted(db_url: str, **request: Any) -> int:
    [step] = unknown(db_url, **request)
    resolution = Resolution.parse("accepted", "seen in the mailbox", provider_message_id="pm-42")
    with_store(db_url, lambda s: s.resolve(step, resolution, actor="bob", default_max_attempts=3))
    return step


def listed(page: str) -> list[int]:
    """The step ids of the list's rows, in order."""
    table = re.search(r'<table class="rows" id="step-rows">.*?</table>', page, flags=re.S)
    assert table, page[-2000:]
    return [int(i) for i in re.findall(r'<tr data-step="(\d+)"', table[0])]


def tab_count(page: str, tab: str) -> str:
    match = re.search(rf'id="tab-{tab}"[^>]*>[^<]*<span class="count">\(([^)]*)\)</span>', page)
    assert match, page[:3000]
    return match[1]


def test_each_states_tab_shows_its_rows_its_columns_and_its_count(server, db_url):
    # Made in this order so that each claim takes only its own rows (a claim takes the oldest pending).
    made: dict[str, list[int]] = {"in_flight": [in_flight(db_url, run_id="run-t")]}
    made["unknown"] = unknown(db_url, 2, run_id="run-t")
    made["accepted"] = [accepted(db_url, run_id="run-t")]
    made["rejected"] = after_one_try(db_url, 2, max_attempts=1, run_id="run-t")
    made["retryable"] = after_one_try(db_url, 1, max_attempts=3, run_id="run-t")  # claimable: made last
    made["held"] = held(db_url, 2, run_id="run-t")
    made["pending"] = pending(db_url, 1, run_id="run-t")
    assert {step_row(db_url, i)["status"] for i in made["rejected"]} == {"rejected"}
    everything = sorted(i for ids in made.values() for i in ids)
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        for tab, ids in made.items():
            page = web.get(f"/ops/steps?status={tab}&run_id=run-t")
            assert page.status_code == 200, page.text[-2000:]
            assert sorted(listed(page.text)) == sorted(ids), tab
            assert re.search(rf'id="tab-{tab}"[^>]*aria-current="page"', page.text), tab
            for other, other_ids in made.items():
                assert tab_count(page.text, other) == str(len(other_ids)), (tab, other)
            assert tab_count(page.text, "all") == str(len(everything))
        columns = {
            "held": ("why held", "expires"),
            "unknown": ("unknown since", "last answer", "next action"),
            "rejected": ("reason",),
            "accepted": ("provider message id", "delivery"),
        }
        for tab, headers in columns.items():
            head = re.search(r"<thead>(.*?)</thead>", web.get(f"/ops/steps?status={tab}").text, flags=re.S)[1]
            assert all(f'<th scope="col">{h}</th>' in head for h in headers), (tab, head)
        page = web.get("/ops/steps?status=accepted").text
        assert '<td class="provider-message-id">pm-42</td>' in page
        assert "<time datetime=" in page  # times through the `when` filter
        page = web.get("/ops/steps?status=rejected").text
        assert page.count("attempts exhausted") + page.count("attempts_exhausted") >= 2
        everyone = web.get("/ops/steps?run_id=run-t").text
        assert sorted(listed(everyone)) == everything and 'id="tab-all" href' in everyone
        assert re.search(r'id="tab-all"[^>]*aria-current="page"', everyone)
        assert f"Showing 1–{len(everything)} of {len(everything)} steps." in everyone


def test_the_list_pages_with_previous_and_next_and_keeps_the_filters(server, db_url):
    ids = pending(db_url, 105, run_id="run-p")
    pending(db_url, 2, run_id="run-other")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        first = web.get("/ops/steps?status=pending&run_id=run-p").text
        assert len(listed(first)) == 100 and "Showing 1–100 of 105 pending steps." in first
        nxt = html_lib.unescape(re.search(r'<a rel="next" id="next" href="([^"]+)"', first)[1])
        assert "run_id=run-p" in nxt and "status=pending" in nxt and "offset=100" in nxt
        second = web.get(nxt).text
        assert "Showing 101–105 of 105 pending steps." in second and 'rel="next"' not in second
        assert sorted(listed(first) + listed(second)) == sorted(ids)
        prev = html_lib.unescape(re.search(r'<a rel="prev" id="prev" href="([^"]+)"', second)[1])
        assert listed(web.get(prev).text) == listed(first)
        refused = web.get("/ops/steps?status=lost")
        assert refused.status_code == 400 and "one of all, held" in refused.text


def preview(web: httpx.Client, token: str, **form: str) -> httpx.Response:
    return web.post("/ops/bulk/preview", data={"csrf": token, **form})


def previewed_ids(page: str) -> str:
    return re.search(r'name="ids" value="([^"]*)"', page)[1]


def seen(page: str) -> str:
    """The ids a preview showed with the state each was in (the apply form's ``seen``)."""
    return re.search(r'name="seen" value="([^"]*)"', page)[1]


def applied(page: str) -> dict[str, str]:
    """The preview's apply form as a browser posts it: every hidden field, the seal included."""
    return form_fields(page, "/ops/bulk/apply")


def evidence_of(db_url: str, step_id: int) -> list[dict[str, Any]]:
    return rows(
        db_url, "SELECT kind, actor, detail ->> 'note' AS note FROM evidence WHERE step_id = %s ORDER BY id", (step_id,)
    )


def test_a_bulk_cancel_acts_on_exactly_the_previewed_rows_and_reports_the_one_approved_meanwhile(server, db_url):
    a, b, c = held(db_url, 3, run_id="run-c")
    [outside] = held(db_url, 1, run_id="run-c")  # held after the preview: not in it, so not cancelled
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/steps?status=held&run_id=run-c").text)
        with_store(db_url, lambda s: s.cancel(outside, actor="carol", note="not this one", now=None))
        shown = preview(web, token, status="held", run_id="run-c", action="cancel", note="customer unsubscribed")
        assert shown.status_code == 200, shown.text[-2000:]
        assert "<strong>3</strong> rows would be cancelled" in shown.text
        assert previewed_ids(shown.text) == f"{a},{b},{c}"
        assert {step_row(db_url, i)["status"] for i in (a, b, c)} == {"held"}  # a preview changes nothing
        [late] = held(db_url, 1, run_id="run-c")  # a new match after the preview is not in its ids
        with_store(
            db_url, lambda s: s.approve(b, actor="bob", actor_key_id="k-bob", note="bob approved first", now=None)
        )
        done = web.post("/ops/bulk/apply", data=applied(shown.text))
    assert done.status_code == 200, done.text[-2000:]
    assert "Bulk cancel: 2 done, 1 not done" in done.text, done.text[done.text.find("<main>") :]
    conflict = re.search(rf'<tr class="failed" data-step="{b}">.*?</tr>', done.text, flags=re.S)
    assert conflict and "conflict: someone else changed it" in conflict[0] and "E_CONFLICT" in conflict[0]
    assert re.search(r'<td class="state-now">pending', conflict[0])
    assert [step_row(db_url, i)["status"] for i in (a, b, c)] == ["rejected", "pending", "rejected"]
    assert {step_row(db_url, i)["reason"] for i in (a, c)} == {"cancelled"}
    for i in (a, c):
        assert evidence_of(db_url, i)[-1] == {"kind": "cancelled", "actor": "alice", "note": "customer unsubscribed"}
    assert [e["kind"] for e in evidence_of(db_url, b)][-1] != "cancelled"
    assert step_row(db_url, late)["status"] == "held"


def test_a_blank_note_is_refused_and_changes_nothing(server, db_url):
    ids = held(db_url, 2, run_id="run-n")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/steps?status=held").text)
        for path, extra in (
            ("/ops/bulk/preview", {}),
            ("/ops/bulk/apply", {"seen": ",".join(f"{i}:held" for i in ids)}),
        ):
            answer = web.post(path, data={"csrf": token, "action": "deny", "status": "held", "note": "  ", **extra})
            assert answer.status_code == 422, (path, answer.status_code)
            assert "<code>note</code>: required: say what you checked and why" in answer.text
    assert {step_row(db_url, i)["status"] for i in ids} == {"held"}


def test_the_cli_command_shown_run_for_real_does_the_same_on_other_rows(server, db_url):
    shown_rows = held(db_url, 2, run_id="run-cli")
    other_rows = held(db_url, 2, run_id="run-cli-2")
    key = make_key(db_url, "alice", "operator")
    note = "checked with the account owner; it's fine"
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, key)
        token = _csrf(web.get("/ops/steps?status=held").text)
        shown = preview(web, token, status="held", run_id="run-cli", action="approve", note=note)
    assert shown.status_code == 200, shown.text[-2000:]
    command = html_lib.unescape(
        re.search(r'<pre class="cli" data-kind="exactly these rows"><code>(.*?)</code>', shown.text)[1]
    )
    ids = " ".join(map(str, shown_rows))
    assert (
        command
        == f"for id in {ids}; do evq steps approve \"$id\" --note 'checked with the account owner; it'\"'\"'s fine'; done"
    )
    other = command.replace(f"for id in {ids};", f"for id in {' '.join(map(str, other_rows))};")
    env = {**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_API_KEY": key, "PYTHONPATH": ROOT}
    ran = subprocess.run(["bash", "-c", other], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert [step_row(db_url, i)["status"] for i in other_rows] == ["pending", "pending"]
    assert [step_row(db_url, i)["status"] for i in shown_rows] == ["held", "held"]  # the shown rows untouched
    for i in other_rows:
        assert evidence_of(db_url, i)[-1] == {"kind": "approved", "actor": "alice", "note": note}


def test_a_bulk_close_offers_the_filter_form_and_a_bulk_retry_requeues_only_requeueable_rejected_rows(server, db_url):
    dead = after_one_try(db_url, 2, max_attempts=1, run_id="run-r")
    [closed_by_hand] = unknown(db_url, 1, run_id="run-r")
    with_store(
        db_url,
        lambda s: s.resolve(
            closed_by_hand, Resolution.parse("rejected", "bounced"), actor="bob", default_max_attempts=3
        ),
    )
    [lost] = unknown(db_url, 1, run_id="run-r", provider="smtp")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        token = _csrf(web.get("/ops/steps?status=rejected").text)
        shown = preview(web, token, status="rejected", run_id="run-r", action="retry", note="provider is back")
        assert shown.status_code == 200, shown.text[-2000:]
        assert sorted(map(int, previewed_ids(shown.text).split(","))) == sorted(dead)
        # A row added to the preview's ids (one it left out: not requeueable) is no preview's.
        forged = web.post(
            "/ops/bulk/apply", data=applied(shown.text) | {"seen": f"{seen(shown.text)},{closed_by_hand}:rejected"}
        )
        assert forged.status_code == 422 and "not a preview this server showed" in forged.text
        assert [step_row(db_url, i)["status"] for i in dead] == ["rejected", "rejected"]
        done = web.post("/ops/bulk/apply", data=applied(shown.text))
        assert done.status_code == 200 and "Bulk retry: 2 done" in done.text
        close = preview(
            web,
            token,
            status="unknown",
            run_id="run-r",
            provider="smtp",
            action="close",
            verdict="accepted",
            note="seen",
        )
    assert [step_row(db_url, i)["status"] for i in dead] == ["retryable", "retryable"]
    assert step_row(db_url, closed_by_hand)["status"] == "rejected"  # not requeueable: refused, unchanged
    filter_form = html_lib.unescape(
        re.search(r'data-kind="the same filter, as of now"><code>(.*?)</code>', close.text)[1]
    )
    assert filter_form == "evq steps resolve --as accepted --note seen --status unknown --run-id run-r --provider smtp"
    assert previewed_ids(close.text) == str(lost)


def test_an_agent_key_sees_no_bulk_form_and_is_refused_a_forged_one(server, db_url):
    ids = held(db_url, 2)
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "bot", "agent"))
        page = web.get("/ops/steps?status=held")
        assert page.status_code == 200 and sorted(listed(page.text)) == sorted(ids)
        assert 'id="bulk-form"' not in page.text and "/ops/bulk/preview" not in page.text
        token = _csrf(page.text)
        for path in ("/ops/bulk/preview", "/ops/bulk/apply"):
            forged = web.post(
                path, data={"csrf": token, "action": "cancel", "note": "x", "seen": ",".join(f"{i}:held" for i in ids)}
            )
            assert forged.status_code == 403 and "E_AUTH_FAILED" in forged.text, (path, forged.text[-1500:])
    assert {step_row(db_url, i)["status"] for i in ids} == {"held"}


def test_attacker_text_in_a_subject_stays_text_in_the_list_and_the_preview(server, db_url):
    [step] = held(db_url, 1, subject=XSS, run_id="run-x")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        page = web.get("/ops/steps?status=held&run_id=run-x").text
        shown = preview(web, _csrf(page), status="held", run_id="run-x", action="deny", note="<b>spam</b>").text
    for html in (page, shown):
        assert "<script>document.title" not in html and "<img src=x" not in html
        assert "&lt;script&gt;document.title=" in html
    assert "<b>spam</b>" not in shown and "&lt;b&gt;spam&lt;/b&gt;" in shown
    assert listed(page) == [step]


def test_in_chromium_an_operator_searches_opens_a_tab_previews_a_bulk_deny_and_applies_it(server, browser, db_url):
    from selenium.webdriver.common.by import By

    ids = held(db_url, 2, to=["ada@chrome.example"], run_id="run-chrome")
    [other] = held(db_url, 1, run_id="run-chrome")
    [sent_to_ada] = pending(db_url, 1, to=["ada@chrome.example"])
    sign_in(browser, server, make_key(db_url, "alice", "operator"))
    box = browser.find_element(By.ID, "search-q")  # the header's search box, on the overview
    box.send_keys("ada@chrome.example")
    click_and_load(browser, browser.find_element(By.CSS_SELECTOR, "form[role=search] button"))
    found = [int(r.get_attribute("data-step")) for r in browser.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr")]
    assert sorted(found) == sorted([*ids, sent_to_ada])  # across states
    click_and_load(browser, browser.find_element(By.ID, "tab-held"))
    assert browser.find_element(By.ID, "tab-held").get_attribute("aria-current") == "page"
    shot(browser, "20-steps-search-held")
    found = [int(r.get_attribute("data-step")) for r in browser.find_elements(By.CSS_SELECTOR, "#step-rows tbody tr")]
    assert sorted(found) == sorted(ids)
    details = browser.find_element(By.ID, "bulk")
    assert details.get_attribute("open") is None  # closed by default
    details.find_element(By.TAG_NAME, "summary").click()
    form = browser.find_element(By.ID, "bulk-form")
    form.find_element(By.CSS_SELECTOR, "input[value=deny]").click()
    form.find_element(By.NAME, "note").send_keys("not something we send")
    click_and_load(browser, browser.find_element(By.ID, "bulk-preview"))
    shot(browser, "21-bulk-preview")
    assert "2 rows would be denied" in browser.find_element(By.ID, "preview-count").text
    assert {step_row(db_url, i)["status"] for i in ids} == {"held"}
    click_and_load(browser, browser.find_element(By.ID, "bulk-confirm"))
    shot(browser, "22-bulk-done")
    assert "Bulk deny: 2 done, 0 not done" in browser.find_element(By.ID, "bulk-summary").text
    assert [(step_row(db_url, i)["status"], step_row(db_url, i)["reason"]) for i in ids] == [("rejected", "denied")] * 2
    assert step_row(db_url, other)["status"] == "held" and step_row(db_url, sent_to_ada)["status"] == "pending"


def test_the_header_search_by_address_finds_rows_across_states_and_an_empty_one_says_what_it_matches(server, db_url):
    [waiting] = held(db_url, 1, to=["ada@customer.example"], run_id="run-s")
    [lost] = unknown(db_url, 1, to=["ada@customer.example"], run_id="run-s")
    queued = pending(db_url, 1, to=["ada@customer.example"], run_id="run-s")
    pending(db_url, 2, to=["bob@elsewhere.example"], run_id="run-s")
    with httpx.Client(base_url=server, timeout=30) as web:
        _signed_in(web, make_key(db_url, "alice", "operator"))
        overview = web.get("/ops").text
        box = re.search(
            r'<form class="inline" role="search" method="get" action="/ops/steps"[^>]*>.*?</form>', overview, flags=re.S
        )
        assert box and '<label for="search-q">' in box[0] and 'name="q"' in box[0]
        found = web.get("/ops/steps", params={"q": "ada@customer.example"}).text
        assert sorted(listed(found)) == sorted([waiting, lost, *queued])
        assert (tab_count(found, "held"), tab_count(found, "unknown"), tab_count(found, "pending")) == ("1", "1", "1")
        assert tab_count(found, "all") == "3"
        one = web.get("/ops/steps", params={"q": str(lost)}).text  # one match: still the list, one row
        assert listed(one) == [lost]
        none = web.get("/ops/steps", params={"q": "nobody@nowhere.example", "status": "held"}).text
        assert listed(none) == [] and "nobody@nowhere.example" in none
        assert "The search box matches a step id, a recipient address or @domain" in none


def test_in_chromium_the_held_queue_approves_a_hundred_and_twenty_at_once_but_never_the_approvers_own(
    server, browser, db_url
):
    """Issue 30: when every agent send is held, the held queue must clear many at once. From
    /ops/held itself, an admin previews a bulk approve of every held send (more than a page of
    the queue), confirms, and each row goes through the one-row approval: the agent's 120 are
    approved, the two the admin's own key enqueued are refused (a second person decides)."""
    from selenium.webdriver.common.by import By

    from evq.ops.app import service
    from evq.ops.app.service import Caller
    from tests.support import POLICY, request

    agent = make_key(db_url, "bot", "agent", approval=None)  # the default: every send waits
    ada = make_key(db_url, "ada", "admin", approval="always")

    async def enqueue_all(store: Any) -> tuple[list[int], list[int]]:
        asked = [request(run_id="run-many", step_id=f"s-{i}") for i in range(120)]
        many = await service.enqueue(store, Caller(agent, interface="http"), asked, POLICY, many=True)
        own = [request(run_id="run-own", step_id=f"s-{i}") for i in range(2)]
        mine = await service.enqueue(store, Caller(ada, interface="http"), own, POLICY, many=True)
        return [d["id"] for d in many.data], [d["id"] for d in mine.data]

    theirs, mine = with_store(db_url, enqueue_all)
    assert {step_row(db_url, i)["status"] for i in theirs + mine} == {"held"}
    sign_in(browser, server, ada)
    browser.get(server + "/ops/held")
    assert "122 sends wait for a person" in browser.find_element(By.ID, "held-total").text
    details = browser.find_element(By.ID, "bulk")
    details.find_element(By.TAG_NAME, "summary").click()
    form = browser.find_element(By.ID, "bulk-form")
    form.find_element(By.CSS_SELECTOR, "input[value=approve]").click()
    form.find_element(By.NAME, "note").send_keys("the onboarding batch, checked")
    click_and_load(browser, browser.find_element(By.ID, "bulk-preview"))
    shot(browser, "23-held-bulk-preview")
    assert "122 rows would be approved" in browser.find_element(By.ID, "preview-count").text
    assert {step_row(db_url, i)["status"] for i in theirs + mine} == {"held"}  # a preview changes nothing
    click_and_load(browser, browser.find_element(By.ID, "bulk-confirm"))
    shot(browser, "24-held-bulk-done")
    assert "Bulk approve: 120 done, 2 not done" in browser.find_element(By.ID, "bulk-summary").text
    for i in mine:
        refused = browser.find_element(By.CSS_SELECTOR, f'#bulk-results tr[data-step="{i}"]').text
        assert "E_AUTH_FAILED" in refused and "held" in refused
    assert {step_row(db_url, i)["status"] for i in theirs} == {"pending"}
    assert {step_row(db_url, i)["status"] for i in mine} == {"held"}
    approved = rows(db_url, "SELECT DISTINCT actor FROM evidence WHERE kind = 'approved'")
    assert approved == [{"actor": "ada"}]
