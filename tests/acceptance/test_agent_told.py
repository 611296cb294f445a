"""Issue 15, "every failure reaches the agent that asked", driven for real: the CLI
creates an agent key with a default notification address and enqueues with it (no
notify in the request), a worker sends to a real SMTP server that refuses, and the
notice arrives at the key's address; the key's event feed has the rejection, and the
run's record names the key that asked."""

from __future__ import annotations

import email
import email.policy
import json

from tests.acceptance.conftest import Evq, smtp_env
from tests.support import request

INBOX = "agent-7-inbox@example.org"


def _notice(smtp, to: str) -> email.message.EmailMessage:
    [notice] = [m for m in smtp.messages if m["rcpt_tos"] == [to]]
    return email.message_from_bytes(notice["data"], policy=email.policy.default)


def test_a_rejected_send_without_notify_reaches_the_key_that_enqueued_it(evq, db_url, smtp):
    made = evq.json(
        "keys", "create", "--name", "agent-7", "--role", "agent", "--approval", "policy", "--notify-email", INBOX
    )["data"]
    assert made["notify_email"] == INBOX and made["approval"] == "policy"
    assert made["failures"]["notify_email"] == INBOX and made["failures"]["feed_only"] is False
    agent = Evq(db_url, api_key=made["key"])
    step = agent.json("enqueue", "--file", "-", input=json.dumps(request(run_id="told", to=["reject@example.com"])))
    done = agent.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]

    message = _notice(smtp, INBOX)
    original = step["data"]["message_id"]
    assert message["In-Reply-To"] == original and message["References"] == original
    body = message.get_body(("plain",)).get_content()
    for expected in (
        "the provider refused the message [provider_rejected]",
        "What each reason means, and what to do:",
        "policy_refused:",
        "Do NOT send it again",
        "API key 'agent-7'",
    ):
        assert expected in body, (expected, body)

    feed = agent.json("events", "list", "--since", "0")
    [event] = feed["data"]
    assert (event["kind"], event["step"], event["key_name"]) == ("rejected", step["data"]["id"], "agent-7")
    assert feed["meta"]["next_cursor"] == event["id"]
    assert agent.json("events", "list", "--since", str(event["id"]))["data"] == []
    shown = agent.run("events", "list")
    assert shown.returncode == 0 and f"next: evq events list --since {event['id']}" in shown.stdout, shown
    assert "provider_rejected" in shown.stdout
    human = evq.run("steps", "show", str(step["data"]["id"]))
    assert f"asked by        agent-7 (key {made['key_prefix']}) via cli" in human.stdout, human.stdout
    # An agent key reads only its own feed; the admin reads any key's.
    refused = agent.json("events", "list", "--all-keys", expect=4)
    assert refused["error"]["code"] == "E_AUTH_FAILED"
    assert [e["id"] for e in evq.json("events", "list", "--key", "agent-7")["data"]] == [event["id"]]

    run = evq.json("runs", "show", "told")["data"]
    enqueued = next(e for e in run["events"] if e["kind"] == "enqueued")
    assert enqueued["actor"] == "agent-7" and enqueued["detail"]["interface"] == "cli"
    decision = evq.json("steps", "show", str(step["data"]["id"]))["data"]["decision"]
    assert (decision["actor"], decision["actor_key_id"]) == ("agent-7", made["key_prefix"].removeprefix("evq_"))


def test_keys_update_changes_and_clears_the_default_address(evq):
    evq.json("keys", "create", "--name", "agent-8", "--role", "agent")
    shown = evq.json("keys", "update", "agent-8", "--notify-email", INBOX)["data"]
    assert (shown["notify_email"], shown["changed"]) == (INBOX, True)
    assert evq.json("keys", "update", "agent-8", "--notify-email", INBOX)["data"]["changed"] is False
    listed = {k["name"]: k for k in evq.json("keys", "list")["data"]}
    assert listed["agent-8"]["notify_email"] == INBOX
    assert evq.json("keys", "update", "agent-8", "--clear-notify-email")["data"]["notify_email"] is None
    bad = evq.json("keys", "update", "agent-8", "--notify-email", "not an address", expect=2)
    assert bad["error"]["context"]["fields"][0]["field"] == "--notify-email"
    assert evq.json("keys", "update", "nobody", "--clear-notify-email", expect=1)["error"]["code"] == "E_NOT_FOUND"


def test_a_callback_url_prints_its_signing_secret_once_and_rotates(evq, db_url):
    made = evq.json(
        "keys", "create", "--name", "agent-9", "--role", "agent", "--notify-url", "https://hooks.example.org/evq"
    )["data"]
    assert made["notify_url"] == "https://hooks.example.org/evq" and made["callback_secret"].startswith("whsec_")
    listed = {k["name"]: k for k in evq.json("keys", "list")["data"]}
    assert "callback_secret" not in listed["agent-9"]
    rotated = evq.json("keys", "update", "agent-9", "--rotate-callback-secret")["data"]
    assert rotated["callback_secret"].startswith("whsec_") and rotated["callback_secret"] != made["callback_secret"]
    cleared = evq.json("keys", "update", "agent-9", "--clear-notify-url")["data"]
    assert (cleared["notify_url"], cleared["callback_secret"]) == (None, None)
    bad = evq.json("keys", "update", "agent-9", "--notify-url", "https://user:pw@hooks.example.org/", expect=2)
    assert bad["error"]["context"]["fields"][0]["field"] == "--notify-url"
    assert evq.json("keys", "update", "agent-9", expect=2)["error"]["code"] == "E_INVALID_ARG"


def test_a_drained_worker_posts_the_signed_callback_of_a_rejection(evq, db_url, smtp, receiver):
    made = evq.json(
        "keys", "create", "--name", "agent-10", "--role", "agent", "--approval", "policy", "--notify-url", receiver.url
    )["data"]
    receiver.use(made["callback_secret"])
    agent = Evq(db_url, api_key=made["key"])
    step = agent.json("enqueue", "--file", "-", input=json.dumps(request(run_id="hook", to=["reject@example.com"])))
    done = agent.run("worker", "run", "--drain", **smtp_env(smtp, EVQ_HTTP_CALLBACK_ALLOW_PRIVATE="true"))
    assert done.returncode == 0, done.stderr[-2000:]
    [posted] = receiver.received
    assert posted["valid"] and posted["fresh"]
    assert (posted["body"]["type"], posted["body"]["data"]["step"]) == ("evq.step.rejected", step["data"]["id"])
    assert "receiver-token" not in done.stderr and made["callback_secret"] not in done.stderr
