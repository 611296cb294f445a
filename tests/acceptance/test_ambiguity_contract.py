"""Issue 17's ambiguity contract driven for real: an agent that reads a step is told whether a
resend is safe and what to do next (safe_to_retry, next_action) on every view, and waits for
a send (`evq steps wait`, `GET /v1/steps/{id}?wait=`) instead of polling: a real worker sends
to a real SMTP server while the wait is open, and the wait answers when it is done."""

from __future__ import annotations

import json
import threading
import time

from tests import contract
from tests.acceptance.conftest import Evq, make_key, smtp_env
from tests.support import request, unknown_steps, with_store
from tests.web.support import checked, serving


def test_steps_wait_answers_when_the_worker_has_sent_it(evq, db_url, smtp):
    asked = json.dumps(request(run_id="r-wait"))
    sent = evq.json("enqueue", "--file", "-", input=asked)["data"]
    assert (sent["next_action"], sent["safe_to_retry"], sent["created"]) == ("wait", False, True)
    waiting = Evq(db_url, process=True).popen("steps", "wait", str(sent["id"]), "--timeout", "50s", "-o", "json")
    try:
        time.sleep(0.5)  # the wait is polling before anything is sent
        assert waiting.poll() is None
        done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
        assert done.returncode == 0, done.stderr[-2000:]
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill() if waiting.poll() is None else None
    assert waiting.returncode == 0, err[-2000:]
    answer = json.loads(out)
    contract.check(("steps", "wait"), answer)
    step = answer["data"]["step"]
    assert (step["status"], step["next_action"], step["safe_to_retry"]) == ("accepted", "none", False)
    assert answer["meta"]["timed_out"] is False and 500 <= answer["meta"]["waited_ms"] < 50_000
    assert len(smtp.messages) == 1  # sent once
    # A repeat of the enqueue is answered as the row is: sent, nothing to do.
    again = evq.json("enqueue", "--file", "-", input=asked)["data"]
    assert (again["created"], again["status"], again["next_action"]) == (False, "accepted", "none")
    listed = evq.json("steps", "list", "--run-id", "r-wait")["data"]
    assert [(s["next_action"], s["next_action_label"]) for s in listed] == [("none", "nothing to do")]
    human = evq.run("steps", "show", str(sent["id"]))
    assert "next action     nothing to do" in human.stdout, human.stdout


def test_a_rejected_step_is_safe_to_resend_after_the_message_is_fixed(evq, smtp):
    sent = evq.json("enqueue", "--file", "-", input=json.dumps(request(run_id="r-no", to=["reject@example.com"])))
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    step = evq.json("steps", "wait", str(sent["data"]["id"]), "--timeout", "1s")["data"]["step"]
    assert (step["status"], step["safe_to_retry"], step["next_action"]) == ("rejected", True, "fix_and_resend")
    human = evq.run("steps", "wait", str(sent["data"]["id"]), "--timeout", "1s")
    assert human.returncode == 0 and "next action     fix the message" in human.stdout, human.stdout
    assert "(safe to send again)" in human.stdout and "timed out" not in human.stdout


def test_an_unknown_step_needs_an_operator_unless_its_provider_can_settle_it(evq, db_url):
    """smtp with no witness, relay or webhook can never settle a lost answer: ask an operator. The
    http adapter can ask its provider (the reconciler will): wait. Every view says the same."""
    [smtp_lost] = with_store(db_url, lambda store: unknown_steps(store, run_id="r-lost", step_id="a"))
    [http_lost] = with_store(db_url, lambda store: unknown_steps(store, run_id="r-lost", step_id="b", provider="http"))
    expected = {smtp_lost.id: "ask_operator", http_lost.id: "wait"}
    for step_id, action in expected.items():
        shown = evq.json("steps", "show", str(step_id))["data"]["step"]
        assert (shown["status"], shown["next_action"], shown["safe_to_retry"]) == ("unknown", action, False)
    listed = evq.json("steps", "list", "--status", "unknown")["data"]
    assert {s["id"]: s["next_action"] for s in listed} == expected
    run = evq.json("runs", "show", "r-lost")["data"]
    assert {s["id"]: s["next_action"] for s in run["steps"]} == expected
    # The one that needs an operator is answered at once; the other waits out its timeout.
    now = evq.json("steps", "wait", str(smtp_lost.id), "--timeout", "20s")
    assert now["meta"]["timed_out"] is False and now["meta"]["waited_ms"] < 10_000
    later = evq.json("steps", "wait", str(http_lost.id), "--timeout", "700ms")
    assert later["meta"]["timed_out"] is True and later["meta"]["waited_ms"] >= 700


def test_http_wait_returns_early_when_the_worker_finishes(evq, db_url, smtp):
    agent = make_key(db_url, "bot", "agent")
    with serving(db_url) as served:
        http = served.client(agent)
        made = checked(http.post("/v1/steps", json=request(run_id="r-http")))
        assert made["data"]["next_action"] == "wait" and made["data"]["safe_to_retry"] is False
        step_id = made["data"]["id"]
        # The timeout path: nobody sends it, so the answer comes at the timeout, as it is.
        started = time.monotonic()
        late = checked(http.get(f"/v1/steps/{step_id}", params={"wait": "1s"}))
        assert time.monotonic() - started >= 1
        assert late["meta"]["timed_out"] is True and late["data"]["step"]["next_action"] == "wait"
        bad = http.get(f"/v1/steps/{step_id}", params={"wait": "2h"})
        assert bad.status_code == 400 and checked(bad)["error"]["code"] == "E_INVALID_ARG"
        assert checked(bad)["error"]["context"]["fields"][0]["field"] == "wait"

        answers: list = []
        asking = threading.Thread(
            target=lambda: answers.append(http.get(f"/v1/steps/{step_id}", params={"wait": "50s"}, timeout=60))
        )
        started = time.monotonic()
        asking.start()
        time.sleep(0.5)
        done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
        assert done.returncode == 0, done.stderr[-2000:]
        asking.join(timeout=30)
        took = time.monotonic() - started
    [answer] = answers
    body = checked(answer)
    assert answer.status_code == 200 and took < 40
    assert body["meta"]["timed_out"] is False
    assert (body["data"]["step"]["status"], body["data"]["step"]["next_action"]) == ("accepted", "none")
    # A waited answer is steps show's document (checked() held it to that schema) with the
    # wait's meta: steps wait's schema too.
    contract.check(("steps", "wait"), body)
    assert len(smtp.messages) == 1


def test_a_step_an_operator_closed_as_rejected_says_none_and_not_safe_everywhere(db_url):
    """Issue 29: a step closed `rejected` by an operator's verdict (from unknown) still said
    `ask_operator`; an operator closed it already, and the README says a closed step reads `none`.
    It may have been delivered, so a resend is never called safe. Read in child processes."""
    [lost] = with_store(db_url, lambda store: unknown_steps(store, run_id="r-closed", step_id="a"))
    reader = Evq(db_url, process=True)
    before = reader.json("steps", "show", str(lost.id))["data"]["step"]
    assert (before["status"], before["next_action"], before["safe_to_retry"]) == ("unknown", "ask_operator", False)

    alice = Evq(db_url, api_key=make_key(db_url, "alice", "operator"), process=True)
    closed = alice.json(
        "steps", "resolve", str(lost.id), "--as", "rejected", "--note", "the provider's log is gone; giving up"
    )["data"]
    assert closed["succeeded"] == 1 and closed["results"][0]["to_status"] == "rejected"

    shown = reader.json("steps", "show", str(lost.id))["data"]["step"]
    assert (shown["status"], shown["reason"], shown["maybe_delivered"]) == ("rejected", "operator", True)
    assert (shown["next_action"], shown["safe_to_retry"]) == ("none", False)
    [listed] = reader.json("steps", "list", "--run-id", "r-closed")["data"]
    assert (listed["next_action"], listed["safe_to_retry"]) == ("none", False)
    [in_run] = reader.json("runs", "show", "r-closed")["data"]["steps"]
    assert (in_run["next_action"], in_run["safe_to_retry"]) == ("none", False)
    waited = reader.json("steps", "wait", str(lost.id), "--timeout", "20s")
    assert waited["meta"]["timed_out"] is False and waited["data"]["step"]["next_action"] == "none"
    human = reader.run("steps", "show", str(lost.id))
    assert "next action     nothing to do" in human.stdout, human.stdout


def test_a_refusal_that_answers_a_rescued_attempt_late_is_safe_to_fix_and_resend(db_url):
    """The other closed path that kept "may have been delivered": the rescuer marked the attempt
    so when its lease ran out, then the provider's answer came, a definite refusal
    (step_record_late closes the step `rejected`, reason `late_answer`). Nothing was sent."""
    from datetime import UTC, datetime, timedelta

    from evq.worker.backoff import Backoff
    from evq.worker.outcomes import Rejected
    from evq.worker.transitions import decide
    from tests.support import valid

    async def late_refusal(store):
        at = datetime.now(UTC) - timedelta(hours=1)
        made = await store.enqueue(valid(run_id="r-late", step_id="a"), now=at)
        [claimed] = await store.claim(
            owner="w-zombie", providers=["smtp"], limit=1, lease_seconds=60, dedupe_windows={}, now=at
        )
        later = at + timedelta(seconds=61)
        rescued = await store.rescue(limit=10, lease_seconds=60, default_max_attempts=3, actor="r", now=later)
        assert rescued.unknown == 1
        answer = decide(
            claimed,
            Rejected("550 no such user"),
            default_max_attempts=3,
            backoff=Backoff(1, 1),
            dedupe_window_open=False,
        )
        [late] = await store.record([answer], actor="w-zombie", now=later)
        assert late.settled
        return made

    made = with_store(db_url, late_refusal)
    shown = Evq(db_url, process=True).json("steps", "show", str(made.id))["data"]["step"]
    assert (shown["status"], shown["reason"]) == ("rejected", "late_answer")
    assert (shown["next_action"], shown["safe_to_retry"]) == ("fix_and_resend", True)
