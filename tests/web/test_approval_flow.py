"""Issue 17's "Done when", through each real protocol: an agent enqueues over MCP with the
first-contact rule on, the send is held; an operator signs in to the ops page in Chromium,
opens the held queue, approves with a note; a real worker delivers it to the dev SMTP server
exactly once, and the next send to that recipient is not held. A denial in Chromium rejects
the send (reason denied); its notify address, itself a first contact the hold waited on, is
told nothing over SMTP, and the agent's key's feed has the rejection (issue 29). And over plain
HTTP: an agent's session cannot approve, a forged form changes nothing, what the agent wrote
stays text. Screenshots go to test-artifacts/approvals/."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from evq.adapters.postgres.health import PostgresHealth
from evq.adapters.postgres.store import PostgresStore
from evq.adapters.smtp import SmtpProvider
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.mcp.server import build_server
from evq.ops.settings import Settings
from evq.worker.runner import Worker
from tests import contract
from tests.acceptance.conftest import make_key
from tests.support import request, rows, serve_process, step_row, wait_until
from tests.web import test_ops_page
from tests.web.test_ops_page import XSS, absent, click_and_load, sign_in

browser = test_ops_page.browser  # headless Chromium, the ops page test's fixture

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "approvals"
# Hold a send to any address its sender was never allowed to mail.
APPROVAL = {"EVQ_APPROVAL_FIRST_CONTACT": "address"}
NOTIFY = "ops-team@example.net"
WORKER = Settings(
    adapter=("smtp",),
    concurrency=2,
    batch_size=2,
    lease_seconds=30,
    poll_interval=0.05,
    retry_base=0.1,
    retry_max=0.2,
    rescue_interval=0.5,
    shutdown_grace=5,
    smtp_timeout=5,
    reconcile_checks=0,
)


def shot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


async def _mcp_enqueue(db_url: str, key: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each request sent as an agent sends it: the MCP SDK's client calling evq_steps_enqueue on
    evq's MCP server, whose settings hold first contacts; each answer checked against the contract."""
    store = await PostgresStore.open(db_url, max_size=2)
    try:
        settings = Settings.load(env=APPROVAL, database_url=db_url)
        server = build_server(store, settings, key, health=PostgresHealth(db_url))
        from mcp import Client

        answers = []
        async with Client(server) as client:
            for asked in requests:
                result = await client.call_tool("evq_steps_enqueue", asked)
                body = result.structured_content
                assert body is not None and not result.is_error, body
                contract.check(("steps", "enqueue"), body)
                answers.append(body["data"])
        return answers
    finally:
        await store.close()


def mcp_enqueue(db_url: str, key: str, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    return asyncio.run(_mcp_enqueue(db_url, key, list(requests)))


@contextmanager
def working(db_url: str, sink: DevSmtpServer) -> Iterator[None]:
    """A real worker (worker/runner.py, the SMTP adapter) claiming and sending for as long as
    the block runs, on an event loop of its own: held sends sit in the queue it polls."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    state: dict[str, Any] = {}

    async def run() -> int:
        store = await PostgresStore.open(db_url, max_size=2)
        provider = SmtpProvider(host="127.0.0.1", port=sink.port, timeout=5.0)
        try:
            worker = Worker(store, {"smtp": provider}, WORKER.worker_config())
            state["worker"] = worker
            started.set()
            return await worker.run(install_signals=False)
        finally:
            started.set()
            await provider.close()
            await store.close()

    thread = threading.Thread(target=lambda: state.update(rc=loop.run_until_complete(run())), daemon=True)
    thread.start()
    assert started.wait(30) and "worker" in state, "the worker did not start"
    try:
        yield
    finally:
        loop.call_soon_threadsafe(state["worker"].request_stop)
        thread.join(60)
        loop.close()
        assert state.get("rc") == 0, "the worker did not stop cleanly"


def held_ids(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [s.get_attribute("data-step") for s in driver.find_elements(By.CSS_SELECTOR, "section.held")]


def evidence(db_url: str, step_id: int, kind: str) -> list[dict[str, Any]]:
    return rows(db_url, "SELECT * FROM evidence WHERE step_id = %s AND kind = %s ORDER BY id", (step_id, kind))


def test_a_first_contact_is_held_approved_in_chromium_and_delivered_once_a_denial_mails_no_stranger(db_url, browser):
    from selenium.webdriver.common.by import By

    agent = make_key(db_url, "bot", "agent", created_by=None)
    alice = make_key(db_url, "alice", "operator")
    ann = request(run_id="run-held", step_id="welcome-ann", to=["Ann <ann@new.example>"], subject="Welcome, Ann")
    bea = request(
        run_id="run-held", step_id="offer-bea", to=["bea@other.example"], subject="A special offer", notify=NOTIFY
    )
    with DevSmtpServer() as sink, working(db_url, sink), serve_process(db_url, **APPROVAL) as served:
        first, second = mcp_enqueue(db_url, agent, ann, bea)
        for sent in (first, second):
            row = step_row(db_url, sent["id"])
            assert row["status"] == "held" and row["held_since"] is not None
            assert "first_contact" in str(row["hold"])
        driver = browser
        sign_in(driver, served.url, alice)
        link = driver.find_element(By.ID, "held-link")
        assert "(2)" in link.text
        shot(driver, "01-overview-with-held")

        click_and_load(driver, link)
        assert held_ids(driver) == [str(first["id"]), str(second["id"])]  # oldest first
        section = driver.find_element(By.ID, f"held-{first['id']}")
        assert "first_contact" in section.find_element(By.CSS_SELECTOR, ".why-held").text
        assert section.find_element(By.CSS_SELECTOR, ".recipients").text == "ann@new.example"
        assert section.find_element(By.CSS_SELECTOR, "dd.subject").text == "Welcome, Ann"
        assert section.find_element(By.CSS_SELECTOR, ".rationale").text == "asked"
        assert "expires in" in section.find_element(By.CSS_SELECTOR, ".expires").text
        headers = section.find_element(By.CSS_SELECTOR, "pre.headers").text
        assert headers.splitlines() == [
            "From: agent@example.org",
            "To: ann@new.example (Ann)",
            "Subject: Welcome, Ann",
            f"Message-ID: {step_row(db_url, first['id'])['message_id']}",
        ]
        assert section.find_element(By.CSS_SELECTOR, "pre.text").text == ann["text"]
        shot(driver, "02-held-queue")
        # The worker has been polling all along: nothing held went out.
        assert sink.messages == []

        click_and_load(driver, section.find_element(By.PARTIAL_LINK_TEXT, "Approve or deny"))
        form = driver.find_element(By.ID, "approve-form")
        form.find_element(By.NAME, "note").send_keys("checked: Ann signed up yesterday")
        shot(driver, "03-approve")
        click_and_load(driver, driver.find_element(By.ID, "approve"))
        assert driver.current_url.endswith(f"/ops/steps/{first['id']}?done=approved")
        assert "Approved" in driver.find_element(By.ID, "done").text
        assert driver.find_element(By.ID, "status").text in ("pending", "in_flight", "accepted")
        shot(driver, "04-approved")

        wait_until(lambda: step_row(db_url, first["id"])["status"] == "accepted", timeout=30, what="delivery")
        message_id = step_row(db_url, first["id"])["message_id"]
        driver.refresh()
        assert driver.find_element(By.ID, "status").text == "accepted"
        shot(driver, "05-delivered")
        [approved] = evidence(db_url, first["id"], "approved")
        assert approved["actor"] == "alice" and approved["detail"]["note"] == "checked: Ann signed up yesterday"

        # Ann is a known recipient now: the agent's next send to her goes out on its own.
        [again] = mcp_enqueue(db_url, agent, request(run_id="run-held", step_id="follow-up", to=["ann@new.example"]))
        assert step_row(db_url, again["id"])["hold"] is None
        assert step_row(db_url, again["id"])["status"] in ("pending", "in_flight", "accepted")
        wait_until(lambda: step_row(db_url, again["id"])["status"] == "accepted", timeout=30, what="the follow-up")

        # The other one is denied in the browser: rejected; its notify address was a first contact
        # of the held send, so it is told nothing (no notice step), and the agent's feed learns.
        driver.get(served.url + "/ops/held")
        assert held_ids(driver) == [str(second["id"])]
        click_and_load(driver, driver.find_element(By.PARTIAL_LINK_TEXT, "Approve or deny"))
        driver.find_element(By.ID, "deny-form").find_element(By.NAME, "note").send_keys("not to cold contacts")
        click_and_load(driver, driver.find_element(By.ID, "deny"))
        assert driver.find_element(By.ID, "status").text == "rejected"
        assert driver.find_element(By.ID, "reason").text == "(denied)"
        assert absent(driver, By.ID, "approve-form") and absent(driver, By.ID, "cancel-form")
        shot(driver, "06-denied")
        [denied] = evidence(db_url, second["id"], "denied")
        assert denied["actor"] == "alice" and denied["detail"]["note"] == "not to cold contacts"
        # A notice is enqueued in the denial's own transaction, or never.
        assert evidence(db_url, second["id"], "notice_enqueued") == []
        assert rows(db_url, "SELECT id FROM steps_now WHERE notice_of = %s", (second["id"],)) == []
        [feed] = rows(db_url, "SELECT * FROM key_events WHERE step = %s AND kind = 'rejected'", (second["id"],))
        assert feed["reason"] == "denied" and feed["actor"] == "alice"
        driver.get(served.url + "/ops/held")
        assert driver.find_element(By.ID, "none").text == "No send is held."
        shot(driver, "07-queue-empty")

    delivered = sink.by_message_id()
    assert delivered[message_id] == 1
    assert delivered[step_row(db_url, again["id"])["message_id"]] == 1
    denied_id = step_row(db_url, second["id"])["message_id"]
    assert denied_id not in delivered  # the denied send never went out
    assert not [m for m in sink.messages if "bea@other.example" in m["rcpt_tos"] or NOTIFY in m["rcpt_tos"]]


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match
    return match[1]


def _signed_in(web: httpx.Client, key: str) -> None:
    signed = web.post("/ops/login", data={"csrf": _csrf(web.get("/ops/login").text), "key": key})
    assert signed.status_code == 303, signed.text[:500]


def test_an_agent_session_cannot_approve_and_the_held_page_escapes_what_the_agent_wrote(db_url):
    agent = make_key(db_url, "bot", "agent", created_by=None)
    alice = make_key(db_url, "alice", "operator")
    asked = request(run_id="run-forged", to=["eve@new.example"], subject=XSS, text="<b>hi</b>", html="<i>x</i>")
    with serve_process(db_url, **APPROVAL) as served:
        with httpx.Client(base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {agent}"}) as api:
            sent = api.post("/v1/steps", json=asked)
        assert sent.status_code in (200, 201), sent.text
        step_id = sent.json()["data"]["id"]
        assert step_row(db_url, step_id)["status"] == "held"
        approve = {"note": "looks fine to me", "subject": "changed"}

        with httpx.Client(base_url=served.url, timeout=30) as bot:
            _signed_in(bot, agent)
            page = bot.get(f"/ops/steps/{step_id}").text
            assert 'id="approve-form"' not in page and 'id="deny-form"' not in page
            # Its own send: the agent may cancel it (ops/app/approvals.py), and the page offers only that.
            assert 'id="cancel-form"' in page and "approves or denies held sends" in page
            token = _csrf(page)  # the sign-out form's: a good token for this session
            for action in ("approve", "deny"):
                forged = bot.post(f"/ops/steps/{step_id}/{action}", data={**approve, "csrf": token})
                assert forged.status_code == 403 and "E_AUTH_FAILED" in forged.text, (action, forged.text[-500:])
            held = bot.get("/ops/held").text
        # What the agent wrote is text on the page: no element was made of it.
        assert "<script>" not in held and "&lt;script&gt;" in held and "<img" not in held
        assert "&lt;i&gt;x&lt;/i&gt;" not in held  # an agent's role does not see the content
        assert step_row(db_url, step_id)["status"] == "held" and evidence(db_url, step_id, "approved") == []

        with httpx.Client(base_url=served.url, timeout=30) as web:
            _signed_in(web, alice)
            page = web.get(f"/ops/steps/{step_id}").text
            token = _csrf(page)
            assert 'id="approve-form"' in page and 'id="deny-form"' in page and 'id="cancel-form"' in page
            held = web.get("/ops/held").text
            assert "&lt;b&gt;hi&lt;/b&gt;" in held and "&lt;i&gt;x&lt;/i&gt;" in held and "<i>x</i>" not in held
            for data in ({**approve}, {**approve, "csrf": "forged"}):
                assert web.post(f"/ops/steps/{step_id}/approve", data=data).status_code == 403
            blank = web.post(f"/ops/steps/{step_id}/approve", data={"note": "  ", "csrf": token})
            assert blank.status_code == 422 and "note" in blank.text
            assert step_row(db_url, step_id)["status"] == "held"

            done = web.post(f"/ops/steps/{step_id}/approve", data={**approve, "text": "", "csrf": token})
            assert done.status_code == 303 and done.headers["location"] == f"/ops/steps/{step_id}?done=approved"
            after = web.get(done.headers["location"]).text
            assert re.search(r'id="status">pending<', after) and 'id="approve-form"' not in after
            again = web.post(f"/ops/steps/{step_id}/approve", data={**approve, "csrf": token})
            assert again.status_code == 409 and "E_CONFLICT" in again.text
    row = step_row(db_url, step_id)
    # The corrected subject is what goes out; the agent's request is kept by its hash.
    assert row["payload"]["subject"] == "changed" and row["payload"]["text"] == "<b>hi</b>"
    assert row["requested_sha256"] is not None and row["requested_sha256"] != row["payload_sha256"]
    [approved] = evidence(db_url, step_id, "approved")
    assert approved["actor"] == "alice"


def test_an_operator_cancels_a_pending_send_on_the_page_and_it_is_never_claimed(db_url):
    agent = make_key(db_url, "bot", "agent", created_by=None)
    alice = make_key(db_url, "alice", "operator")
    with serve_process(db_url) as served:
        with httpx.Client(base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {agent}"}) as api:
            step_id = api.post("/v1/steps", json=request(run_id="run-cancel")).json()["data"]["id"]
        assert step_row(db_url, step_id)["status"] == "pending"
        with httpx.Client(base_url=served.url, timeout=30) as web:
            _signed_in(web, alice)
            page = web.get(f"/ops/steps/{step_id}").text
            assert 'id="cancel-form"' in page and 'id="approve-form"' not in page  # pending: nothing to approve
            done = web.post(f"/ops/steps/{step_id}/cancel", data={"note": "wrong list", "csrf": _csrf(page)})
            assert done.status_code == 303 and done.headers["location"] == f"/ops/steps/{step_id}?done=cancelled"
            after = web.get(done.headers["location"]).text
            assert re.search(r'id="status">rejected<', after) and 'id="cancel-form"' not in after
            again = web.post(f"/ops/steps/{step_id}/cancel", data={"csrf": _csrf(after)})
            assert again.status_code == 409 and "E_CONFLICT" in again.text
    row = step_row(db_url, step_id)
    assert (row["status"], row["reason"], row["attempts"]) == ("rejected", "cancelled", 0)
    [cancelled] = evidence(db_url, step_id, "cancelled")
    assert cancelled["actor"] == "alice"
