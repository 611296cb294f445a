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


def test_keys_create_says_where_failures_go_and_plainly_when_only_the_feed_has_them(evq):
    bare = evq.json("keys", "create", "--name", "agent-12", "--role", "agent")["data"]
    assert bare["approval"] == "always"  # an agent key's default: its sends wait for a person
    assert bare["failures"] == {
        "feed": True,
        "notify_email": None,
        "notify_url": None,
        "feed_only": True,
        "note": bare["failures"]["note"],
    }
    text = evq.run("keys", "create", "--name", "agent-13", "--role", "agent").stdout
    assert "failures of this key's sends will only be in its event feed (`evq events list` with the key)" in text
    assert "Approval: always: every send it enqueues waits for a person" in text
    told = evq.run("keys", "create", "--name", "agent-14", "--role", "agent", "--notify-email", INBOX).stdout
    assert "only be in its event feed" not in told and f"a notice to {INBOX}" in told
    dry = evq.json("keys", "create", "--name", "ops-1", "--role", "operator", "--dry-run")["data"]
    assert (dry["approval"], dry["failures"]["feed_only"]) == ("policy", True)


def test_every_way_a_send_fails_reaches_the_keys_feed_its_callback_and_its_address(evq, db_url, smtp, receiver):
    """Issue 30 (failure-notices): the enqueuing key is the sender, and every failure reaches it,
    whatever the reason: refused by the provider, attempts spent, denied (a hold by a rule or by a
    budget), expired, cancelled, closed by an operator; and an unknown send, which is not a failure
    yet, reaches the feed and the callback. With a default address, each rejection sends a notice
    there (a cancel too). A real worker, SMTP server and HTTP receiver."""
    from evq.worker.approval_actions import HoldExpirer
    from tests.support import execute, rows, step_row, with_store

    made = evq.json(
        "keys", "create", "--name", "agent-11", "--role", "agent", "--approval", "policy",
        "--notify-email", INBOX, "--notify-url", receiver.url,
    )["data"]  # fmt: skip
    receiver.use(made["callback_secret"])
    agent = Evq(db_url, api_key=made["key"], EVQ_BUDGET_RUN_RECIPIENTS="1")

    def send(step: str, run: str | None = None, **overrides) -> int:
        asked = request(run_id=f"fail-{run or step}", step_id=step, **overrides)
        return agent.json("steps", "enqueue", "--file", "-", input=json.dumps(asked))["data"]["id"]

    ids = {
        "provider_rejected": send("refused", to=["reject@example.com"]),
        "attempts_exhausted": send("tempfail", to=["tempfail@example.com"], max_attempts=1),
        "unknown": send("lost", to=["lose-reply@example.com"]),
        "denied": send("denied", require_approval=True),
        "approval_expired": send("expired", require_approval=True),
        "cancelled": send("cancelled", require_approval=True),
    }
    send("budget", to=["first@example.com"])  # the run's one recipient: sent
    ids["budget"] = send("budget-2", run="budget", to=["second@example.com"])
    assert step_row(db_url, ids["budget"])["hold"]["rules"][0]["rule"] == "budget"
    for what in ("denied", "budget"):
        evq.json("steps", "deny", str(ids[what]), "--note", "not this one")
    execute(db_url, "UPDATE email_steps SET hold_expires_at = now() - interval '1 second' WHERE id = %s",
            (ids["approval_expired"],))  # fmt: skip
    assert with_store(db_url, lambda store: HoldExpirer(store).run_once()) == 1
    agent.json("steps", "cancel", str(ids["cancelled"]), "--note", "changed my mind")
    env = smtp_env(smtp, EVQ_HTTP_CALLBACK_ALLOW_PRIVATE="true")
    assert agent.run("worker", "run", "--drain", **env).returncode == 0
    evq.json("steps", "resolve", str(ids["unknown"]), "--as", "rejected", "--note", "the relay's log is gone")
    assert agent.run("worker", "run", "--drain", **env).returncode == 0

    feed = agent.json("events", "list", "--since", "0")["data"]
    got = {(e["step"], e["kind"], e["reason"]) for e in feed}
    assert {(s, k) for s, k, _ in got} == {
        *((ids[w], "rejected") for w in ids if w != "unknown"),
        (ids["unknown"], "unknown"),
        (ids["unknown"], "verdict"),
    }
    reasons = {w: next(r for s, k, r in got if s == ids[w] and k != "verdict") for w in ids}
    assert reasons == {
        "provider_rejected": "provider_rejected",
        "attempts_exhausted": "attempts_exhausted",
        "unknown": "ambiguous_response",
        "denied": "denied",
        "approval_expired": "approval_expired",
        "cancelled": "cancelled",
        "budget": "denied",
    }
    # The callback carries every event, unknown included, each signed.
    posted = {(p["body"]["type"], p["body"]["data"]["step"]) for p in receiver.received if p["valid"]}
    assert ("evq.step.unknown", ids["unknown"]) in posted
    assert {(f"evq.step.{e['kind']}", e["step"]) for e in feed} <= posted
    # The key's address: a notice of each rejection (the operator's close too), none of the unknown.
    notices = {r["notice_of"] for r in rows(db_url, "SELECT notice_of FROM steps_now WHERE notice_of IS NOT NULL")}
    assert notices == {ids[w] for w in ids}
    mailed = [m for m in smtp.messages if m["rcpt_tos"] == [INBOX]]
    assert len(mailed) == len(ids)
