"""Issue 30's "Done when", through each real protocol: an agent platform's key made with default
settings (`evq keys create --role agent`) enqueues over MCP (the `mcp` package's stdio client,
a real `evq mcp` subprocess): the send is held, a real `evq worker run` polling a real SMTP sink
sends nothing; the held answer says who may approve, until when and how to wait; the agent's
`evq_steps_wait` waits through the hold; an operator approves it on the ops page in Chromium;
the wait answers `accepted` once the worker sent it, and the sink has it exactly once. The same
with a key whose approval is `never`, under an installation rule that would otherwise hold the
send: it goes out with no person, and the wait answers `accepted`. Screenshots go to
test-artifacts/agent-default/."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evq.ops.dev.smtp import DevSmtpServer
from tests import contract
from tests.acceptance.conftest import Evq, smtp_env
from tests.support import request, rows, serve_process, spawn, step_row, stop, wait_until
from tests.web import test_ops_page
from tests.web.test_ops_page import click_and_load, sign_in

browser = test_ops_page.browser  # headless Chromium, the ops page test's fixture

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "agent-default"
# A wait is at most a minute; the agent calls again while nobody decided (meta.timed_out).
CALLS = 5


def shot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def keys(db_url: str, *agent_args: str) -> tuple[dict[str, Any], str]:
    """The admin (the bootstrap), the agent's key as `evq keys create` makes it with
    ``agent_args`` (none: the defaults), and an operator's key."""
    admin = Evq(db_url).json("keys", "create", "--name", "admin", "--role", "admin")["data"]["key"]
    evq = Evq(db_url, api_key=admin)
    agent = evq.json("keys", "create", "--name", "bot", "--role", "agent", *agent_args)["data"]
    operator = evq.json("keys", "create", "--name", "alice", "--role", "operator")["data"]["key"]
    return agent, operator


@contextmanager
def worker(db_url: str, sink: DevSmtpServer, tmp: Path) -> Iterator[None]:
    """`evq worker run` in a process of its own, sending to the sink, until the block ends. Its
    log goes to a file: a pipe nobody reads would stall it once full."""
    evq = Evq(db_url)
    with open(tmp / "worker.log", "w") as log:
        proc = spawn(evq.cmd("worker", "run"), env={**evq.env, **smtp_env(sink)}, stdout=log, stderr=log)
    try:
        wait_until(lambda: rows(db_url, "SELECT owner FROM worker_heartbeats"), timeout=30, what="the worker")
        yield
    finally:
        assert stop(proc) == 0, (tmp / "worker.log").read_text()[-3000:]


def mcp_env(db_url: str, key: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVQ_")}
    return {**env, "EVQ_DATABASE_URL": db_url, "EVQ_API_KEY": key, "EVQ_LOG_FORMAT": "json", **extra}


async def call(client: Any, tool: str, arguments: dict[str, Any], command: tuple[str, str]) -> dict[str, Any]:
    """One tool call; its answer checked against the command's contract."""
    result = await client.call_tool(tool, arguments)
    body = result.structured_content
    assert body is not None and not result.is_error, body
    contract.check(command, body)
    return body


async def until_decided(client: Any, step_id: int) -> list[dict[str, Any]]:
    """The agent's wait, called again while it times out (nobody decided yet, or still sending):
    every answer, the last one worth acting on."""
    answers = []
    for _ in range(CALLS):
        body = await call(client, "evq_steps_wait", {"step_id": step_id, "timeout": "60s"}, ("steps", "wait"))
        answers.append(body)
        if not body["meta"]["timed_out"]:
            return answers
    raise AssertionError(f"nobody decided in {CALLS} waits: {answers[-1]['data']['step']['status']}")


def approve_in_chromium(driver: Any, url: str, operator: str, step_id: int) -> None:
    """The operator signs in, opens the held queue, sees whose sends wait there, and approves."""
    from selenium.webdriver.common.by import By

    sign_in(driver, url, operator)
    click_and_load(driver, driver.find_element(By.ID, "held-link"))
    assert [s.get_attribute("data-step") for s in driver.find_elements(By.CSS_SELECTOR, "section.held")] == [
        str(step_id)
    ]
    section = driver.find_element(By.ID, f"held-{step_id}")
    assert "every send by API key 'bot' waits for a person" in section.find_element(By.CSS_SELECTOR, ".why-held").text
    driver.find_element(By.CSS_SELECTOR, "#who-waits summary").click()
    bot = driver.find_element(By.CSS_SELECTOR, "#key-approvals tr[data-key=bot] .approval")
    assert bot.text.startswith("always")
    shot(driver, "01-held-queue")
    click_and_load(driver, section.find_element(By.PARTIAL_LINK_TEXT, "Approve or deny"))
    driver.find_element(By.ID, "approve-form").find_element(By.NAME, "note").send_keys("checked: Ada signed up")
    click_and_load(driver, driver.find_element(By.ID, "approve"))
    assert driver.current_url.endswith(f"/ops/steps/{step_id}?done=approved")
    shot(driver, "02-approved")


def test_an_agents_send_over_mcp_waits_for_a_person_approved_in_chromium_and_arrives_once(db_url, browser, tmp_path):
    from mcp import Client, StdioServerParameters

    agent, operator = keys(db_url)  # the defaults: what an agent platform gets
    assert agent["approval"] == "always"
    # No --notify-email or --notify-url: the answer says plainly where failures go.
    assert agent["failures"]["feed_only"] is True and "only be in its event feed" in agent["failures"]["note"]
    asked = request(run_id="run-agent", step_id="welcome", to=["Ada <ada@example.com>"], subject="Welcome, Ada")
    server = StdioServerParameters(
        command=sys.executable, args=["-m", "tests.child", "mcp"], env=mcp_env(db_url, agent["key"])
    )

    with DevSmtpServer() as sink, serve_process(db_url) as served, worker(db_url, sink, tmp_path):

        async def agent_platform() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            async with Client(server) as client:
                sent = (await call(client, "evq_steps_enqueue", asked, ("steps", "enqueue")))["data"]
                assert (sent["status"], sent["next_action"], sent["safe_to_retry"]) == (
                    "held",
                    "wait_for_approval",
                    False,
                )
                assert sent["hold"]["rules"][0]["rule"] == "always" and sent["hold"]["rules"][0]["key"] == "bot"
                approval = sent["approval"]
                assert approval["approver_roles"] == ["operator", "admin"]
                assert "enqueued it" in approval["not_approver"]
                assert approval["expires_at"] == step_row(db_url, sent["id"])["hold_expires_at"].isoformat()
                assert approval["wait"]["mcp"] == {
                    "tool": "evq_steps_wait",
                    "arguments": {"step_id": sent["id"], "timeout": "60s"},
                }
                # A short wait on a held step waits the whole time, then says so: nobody decided.
                short = await call(
                    client, "evq_steps_wait", {"step_id": sent["id"], "timeout": "1s"}, ("steps", "wait")
                )
                assert short["meta"]["timed_out"] is True and short["meta"]["waited_ms"] >= 1000
                assert short["data"]["step"]["next_action"] == "wait_for_approval"
                # The worker has been polling all along (its heartbeat is there): nothing went out.
                assert step_row(db_url, sent["id"])["status"] == "held" and sink.messages == []
                waiting = asyncio.create_task(until_decided(client, sent["id"]))
                await asyncio.to_thread(approve_in_chromium, browser, served.url, operator, sent["id"])
                return sent, await waiting

        sent, answers = asyncio.run(agent_platform())
        last = answers[-1]
        assert last["meta"]["timed_out"] is False
        assert (last["data"]["step"]["status"], last["data"]["step"]["next_action"]) == ("accepted", "none")
        assert all(a["data"]["step"]["status"] != "held" for a in answers[1:])  # the first wait saw the approval
        wait_until(lambda: len(sink.messages) >= 1, timeout=10, what="the message at the sink")
        message_id = step_row(db_url, sent["id"])["message_id"]

    assert sink.by_message_id() == {message_id: 1}  # exactly one message, the approved one
    [approved] = rows(db_url, "SELECT actor FROM evidence WHERE step_id = %s AND kind = 'approved'", (sent["id"],))
    assert approved["actor"] == "alice"


def test_a_key_whose_approval_is_never_sends_over_mcp_without_a_person(db_url, tmp_path):
    from mcp import Client, StdioServerParameters

    agent, _operator = keys(db_url, "--approval", "never", "--notify-email", "bot-inbox@example.org")
    assert agent["approval"] == "never" and agent["failures"]["feed_only"] is False
    asked = request(run_id="run-never", step_id="welcome", to=["Bea <bea@example.com>"], subject="Welcome, Bea")
    # An installation rule that holds this send under the key's `policy`: Bea is a first contact.
    env = mcp_env(db_url, agent["key"], EVQ_APPROVAL_FIRST_CONTACT="address")
    server = StdioServerParameters(command=sys.executable, args=["-m", "tests.child", "mcp"], env=env)

    with DevSmtpServer() as sink, worker(db_url, sink, tmp_path):

        async def agent_platform() -> tuple[dict[str, Any], list[dict[str, Any]]]:
            async with Client(server) as client:
                policy = (await call(client, "evq_policy_show", {}, ("policy", "show")))["data"]
                assert policy["first_contact"] == "address"
                assert policy["keys"] == [{"name": "bot", "role": "agent", "approval": "never"}]  # its own only
                sent = (await call(client, "evq_steps_enqueue", asked, ("steps", "enqueue")))["data"]
                assert (sent["status"], sent["hold"], sent["approval"]) == ("pending", None, None)
                return sent, await until_decided(client, sent["id"])

        sent, answers = asyncio.run(agent_platform())
        step = answers[-1]["data"]["step"]
        assert (step["status"], step["next_action"]) == ("accepted", "none")
        wait_until(lambda: len(sink.messages) >= 1, timeout=10, what="the message at the sink")
        message_id = step_row(db_url, sent["id"])["message_id"]

    assert sink.by_message_id() == {message_id: 1}
    kinds = [r["kind"] for r in rows(db_url, "SELECT kind FROM evidence WHERE step_id = %s ORDER BY id", (sent["id"],))]
    assert "held" not in kinds and "approved" not in kinds  # no person was asked
