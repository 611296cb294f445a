"""An operator with only `evq`: from the oldest unknown row to a closed row with an
audit trail, one at a time and in bulk, including the ways bulk work stops early."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psycopg

from evq.adapters.postgres.queries import Q
from tests.acceptance.conftest import Evq, make_key, smtp_env
from tests.support import execute, rows, step_row, stop, unknown_steps, wait_for_lock_waiters, with_store


def make_unknown(db_url: str, n: int = 1, *, hours_ago: float, **request) -> list:
    at = datetime.now(UTC) - timedelta(hours=hours_ago)
    return with_store(db_url, lambda store: unknown_steps(store, n, now=at, **request))


def operator(db_url: str, name: str = "alice") -> Evq:
    return Evq(db_url, api_key=make_key(db_url, name, "operator"))


def operator_evidence(db_url: str) -> list[dict]:
    return rows(db_url, "SELECT * FROM evidence WHERE kind = 'operator_resolved' ORDER BY id")


def closed_by_bob(ids: list[int]) -> list[tuple[str, dict]]:
    """Bob closes these rows (in a transaction the test commits when it chooses)."""
    return [
        (
            Q["step_resolve"],
            {
                "now": None,
                "id": step_id,
                "to_status": "rejected",
                "verdict": "rejected",
                "note": "bob was first",
                "reason": None,
                "provider_message_id": None,
                "evidence_url": None,
                "actor": "bob",
                "default_max_attempts": 5,
                "deadline_share": 0.75,
            },
        )
        for step_id in ids
    ]


def held(step_id: int) -> list[tuple[str, tuple]]:
    return [("SELECT 1 FROM email_steps WHERE id = %s FOR UPDATE", (step_id,))]


@contextmanager
def bulk_waiting_on(
    db_url: str, statements: list, *flags: str
) -> Iterator[tuple[subprocess.Popen, psycopg.Connection]]:
    """A bulk close by Alice, stopped at a row another transaction (running ``statements``) holds."""
    other = psycopg.connect(db_url)
    try:
        for sql, params in statements:
            other.execute(sql, params)
        proc = Evq(db_url, api_key=make_key(db_url, "alice", "operator")).popen(
            "steps", "resolve", "--status", "unknown", "--as", "rejected", "--note", "bulk close", *flags, "-o", "json"
        )
        try:
            wait_for_lock_waiters(db_url, 1)
            yield proc, other
        finally:
            stop(proc)  # a test that failed before finish() must not leave the bulk close running
    finally:
        other.close()


def finish(proc: subprocess.Popen, expect: int) -> dict:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == expect, (proc.returncode, out, err[-3000:])
    result = json.loads(out)
    from tests import contract

    contract.check(("steps", "resolve"), result)
    return result


def test_from_the_oldest_unknown_row_to_a_closed_row_with_an_audit_trail(db_url):
    oldest = make_unknown(
        db_url,
        hours_ago=3,
        run_id="run-a",
        intent="send the invoice",
        decision={"model": "m-2", "tool": "send_email", "instruction_version": "v7", "prompt_version": "p3"},
    )[0]
    make_unknown(db_url, hours_ago=1, run_id="run-b")
    reader, alice = Evq(db_url), operator(db_url)

    listed = reader.json("steps", "list", "--status", "unknown", "--limit", "1")
    assert [s["id"] for s in listed["data"]] == [oldest.id]
    assert listed["data"][0]["age_seconds"] >= 3 * 3600 - 60
    assert listed["meta"] == {**listed["meta"], "count": 1, "total": 2, "limit": 1, "offset": 0}
    assert reader.json("steps", "list", "--status", "unknown", "--offset", "5")["meta"]["total"] == 2
    assert "3h" in reader.run("steps", "list", "--status", "unknown").stdout  # the age, for people

    shown = reader.json("steps", "show", str(oldest.id))["data"]
    assert shown["step"]["status"] == "unknown" and shown["decision"]["model"] == "m-2"
    human = reader.run("steps", "show", str(oldest.id)).stdout
    assert f"evq steps resolve {oldest.id} --as accepted|rejected|retry" in human

    chain = reader.json("runs", "show", "run-a")["data"]
    assert [e["kind"] for e in chain["events"]] == ["decision", "enqueued", "attempt_started", "provider_response"]
    decision = chain["events"][0]["detail"]
    assert (
        decision["intent"],
        decision["instruction_version"],
        decision["prompt_version"],
        decision["model"],
        decision["tool"],
    ) == ("send the invoice", "v7", "p3", "m-2", "send_email")
    assert chain["events"][3]["outcome"] == "unknown" and chain["events"][3]["to_status"] == "unknown"

    close = (
        "steps",
        "resolve",
        str(oldest.id),
        "--as",
        "accepted",
        "--note",
        "the provider's log shows it delivered",
        "--reason",
        "found_in_provider_log",
        "--provider-message-id",
        "q-77",
        "--evidence-url",
        "https://logs.example.com/search?q=q-77",
    )
    plan = reader.json(*close, "--dry-run")["data"]  # no key needed to see the plan
    assert plan["dry_run"] and [s["id"] for s in plan["steps"]] == [oldest.id] and plan["to_status"] == "accepted"
    assert step_row(db_url, oldest.id)["status"] == "unknown"

    done = alice.json(*close)["data"]
    assert done["succeeded"] == 1 and done["results"][0]["to_status"] == "accepted"
    again = alice.json(*close, expect=3)
    assert again["error"]["code"] == "E_CONFLICT" and again["error"]["context"]["status"] == "accepted"

    trail = reader.json("runs", "show", "run-a")["data"]["events"][-1]
    assert (trail["kind"], trail["actor"], trail["from_status"], trail["to_status"], trail["reason"]) == (
        "operator_resolved",
        "alice",
        "unknown",
        "accepted",
        "found_in_provider_log",
    )
    assert trail["detail"]["note"] == "the provider's log shows it delivered"
    assert trail["detail"]["reference"]["evidence_url"] == "https://logs.example.com/search?q=q-77"
    assert trail["detail"]["previous"]["status"] == "unknown"
    assert reader.json("steps", "show", str(oldest.id))["data"]["step"]["provider_message_id"] == "q-77"
    assert "operator_resolved" in reader.run("runs", "show", "run-a").stdout
    assert reader.json("steps", "list", "--status", "unknown")["meta"]["total"] == 1


def test_retry_sends_again_with_the_same_key_and_message_id(db_url, smtp):
    [step] = make_unknown(db_url, hours_ago=1, max_attempts=1, to=["carol@example.com"])
    out = operator(db_url).json(
        "steps", "resolve", str(step.id), "--as", "retry", "--note", "nothing in the provider's log for this Message-ID"
    )["data"]
    assert out["results"][0]["max_attempts_raised"] is True and out["results"][0]["max_attempts"] == 2
    reader = Evq(db_url)
    assert reader.run("worker", "run", "--drain", **smtp_env(smtp)).returncode == 0
    smtp.wait_for(1)
    assert smtp.by_message_id() == {step.message_id: 1}
    row = step_row(db_url, step.id)
    assert row["status"] == "accepted" and row["attempts"] == 2 and row["idempotency_key"] == step.idempotency_key


def test_bulk_dry_run_shows_exactly_the_rows_then_each_is_closed(db_url):
    old = make_unknown(db_url, 101, hours_ago=3)
    new = make_unknown(db_url, 2, hours_ago=1)
    reader, alice = Evq(db_url), operator(db_url)
    flags = (
        "steps",
        "resolve",
        "--status",
        "unknown",
        "--older-than",
        "2h",
        "--as",
        "rejected",
        "--note",
        "outage: resent by hand",
    )
    plan = reader.json(*flags, "--dry-run")
    assert [s["id"] for s in plan["data"]["steps"]] == [s.id for s in old] and plan["meta"]["count"] == 101
    assert "101 rows would become rejected" in reader.run(*flags, "--dry-run").stdout
    assert len(operator_evidence(db_url)) == 0

    done = alice.run(*flags, "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["status"] == "success" and out["data"]["succeeded"] == 101 and out["data"]["failed"] == 0
    # Long work reports progress on stderr (every 100 rows, and every few seconds on a slow
    # machine), never on stdout.
    progress = [json.loads(line) for line in done.stderr.splitlines() if '"progress"' in line]
    assert any(p["done"] == 100 for p in progress) and all(p["total"] == 101 for p in progress)
    assert {e["step_id"] for e in operator_evidence(db_url)} == {s.id for s in old}
    assert {s["id"] for s in reader.json("steps", "list", "--status", "unknown")["data"]} == {s.id for s in new}


def test_bulk_reports_partial_failure_when_another_operator_was_first(db_url):
    steps = make_unknown(db_url, 3, hours_ago=1)
    with bulk_waiting_on(db_url, closed_by_bob([steps[1].id])) as (proc, bob):
        bob.commit()
        out = finish(proc, expect=6)
    assert out["status"] == "partial_failure"
    data = out["data"]
    assert (data["succeeded"], data["failed"], data["not_attempted"]) == (2, 1, 0)
    assert [(r["id"], r["outcome"]) for r in data["results"]] == [
        (steps[0].id, "succeeded"),
        (steps[1].id, "failed"),
        (steps[2].id, "succeeded"),
    ]
    assert data["results"][1]["error"]["code"] == "E_CONFLICT"
    # Bob's close stands; Alice wrote nothing for his row.
    assert [(e["step_id"], e["actor"]) for e in operator_evidence(db_url)] == [
        (steps[1].id, "bob"),
        (steps[0].id, "alice"),
        (steps[2].id, "alice"),
    ]


def test_bulk_stops_after_max_failures_in_a_row(db_url):
    steps = make_unknown(db_url, 4, hours_ago=1)
    with bulk_waiting_on(db_url, closed_by_bob([steps[0].id, steps[1].id]), "--max-failures", "2") as (proc, bob):
        bob.commit()
        out = finish(proc, expect=8)
    assert out["error"]["code"] == "E_MAX_FAILURES"
    context = out["error"]["context"]
    assert (context["succeeded"], context["failed"], context["not_attempted"]) == (0, 2, 2)
    assert [step_row(db_url, s.id)["status"] for s in steps[2:]] == ["unknown", "unknown"]


def test_first_ctrl_c_stops_after_the_current_row(db_url):
    steps = make_unknown(db_url, 3, hours_ago=1)
    with bulk_waiting_on(db_url, held(steps[1].id)) as (proc, holder):
        proc.send_signal(signal.SIGINT)
        holder.rollback()
        out = finish(proc, expect=7)
    assert out["error"]["code"] == "E_ABORTED"
    context = out["error"]["context"]
    assert (context["succeeded"], context["failed"], context["not_attempted"]) == (2, 0, 1)
    assert [step_row(db_url, s.id)["status"] for s in steps] == ["rejected", "rejected", "unknown"]


def test_second_ctrl_c_exits_at_once_and_leaves_no_half_written_row(db_url):
    steps = make_unknown(db_url, 2, hours_ago=1)
    with bulk_waiting_on(db_url, held(steps[1].id)) as (proc, _holder):
        proc.send_signal(signal.SIGINT)
        # A signal sent while the same one is pending merges with it: wait until the first is seen.
        for line in iter(proc.stderr.readline, ""):
            if "stopping after the current row" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)  # while its row is still locked
        assert proc.returncode == 130 and out == ""
    assert step_row(db_url, steps[0].id)["status"] == "rejected"
    assert step_row(db_url, steps[1].id)["status"] == "unknown"
    assert [e["step_id"] for e in operator_evidence(db_url)] == [steps[0].id]


def test_bad_resolve_arguments_are_refused_before_anything(db_url):
    [step] = make_unknown(db_url, hours_ago=1)
    alice = operator(db_url)
    out = alice.json(
        "steps",
        "resolve",
        str(step.id),
        "--as",
        "retry",
        "--note",
        " ",
        "--provider-message-id",
        "x",
        "--evidence-url",
        "not a url",
        expect=2,
    )
    assert [f["field"] for f in out["error"]["context"]["fields"]] == [
        "--note",
        "--provider-message-id",
        "--evidence-url",
    ]
    out = alice.json("steps", "resolve", "--as", "rejected", "--note", "n", expect=2)
    assert out["error"]["context"]["fields"][0]["field"] == "STEP_ID"
    out = alice.json(
        "steps", "resolve", str(step.id), "--status", "unknown", "--as", "rejected", "--note", "n", expect=2
    )
    assert "not both" in out["error"]["message"]
    assert (
        alice.json("steps", "resolve", str(step.id), "--as", "maybe", "--note", "n", expect=2)["error"]["code"]
        == "E_INVALID_ARG"
    )
    assert (
        alice.json("steps", "resolve", "999999", "--as", "rejected", "--note", "n", expect=1)["error"]["code"]
        == "E_NOT_FOUND"
    )
    assert operator_evidence(db_url) == [] and step_row(db_url, step.id)["status"] == "unknown"


def test_a_send_closed_as_rejected_tells_the_notify_address_named_at_enqueue(evq: Evq, db_url):
    """`--notify` at enqueue, an operator's `--as rejected`: one failure notice, in the verdict's
    transaction; `--as accepted` sends none, and a repeated verdict (refused) adds none."""
    made = {
        name: evq.json(
            "enqueue",
            "--run-id",
            "run-n",
            "--step-id",
            name,
            "--to",
            "carol@example.com",
            "--from",
            "agent@example.org",
            "--subject",
            f"About {name}",
            "--text",
            "Hi",
            "--notify",
            "agent-inbox@example.org",
        )["data"]
        for name in ("bounced", "delivered")
    }
    for step in made.values():  # the worker's ambiguous answer, written directly (the tests' privilege)
        execute(
            db_url,
            "UPDATE email_steps SET status = 'unknown', reason = 'ambiguous_response', attempts = 1, "
            "first_attempt_at = now(), unknown_since = now() WHERE id = %s",
            (step["id"],),
        )
    bounced, delivered = made["bounced"]["id"], made["delivered"]["id"]
    evq.json("steps", "resolve", str(bounced), "--as", "rejected", "--note", "bounced per the relay log")
    evq.json("steps", "resolve", str(delivered), "--as", "accepted", "--note", "in the relay log")
    again = evq.json("steps", "resolve", str(bounced), "--as", "rejected", "--note", "again", expect=3)
    assert again["error"]["code"] == "E_CONFLICT"

    [notice] = rows(db_url, "SELECT * FROM steps_now WHERE notice_of IS NOT NULL")
    assert notice["notice_of"] == bounced and notice["step_id"] == "evq:notice:rejected:bounced"
    assert notice["payload"]["to"] == [{"email": "agent-inbox@example.org", "name": None}]
    assert notice["payload"]["subject"] == "[delivery failed] About bounced"
    assert "An operator checked this send" in notice["payload"]["text"]
    assert "bounced per the relay log" in notice["payload"]["text"]
    [told] = rows(db_url, "SELECT * FROM evidence WHERE kind = 'notice_enqueued'")
    assert told["step_id"] == bounced and told["actor"] == "test-admin"


def test_bulk_closes_the_rows_its_filters_matched_when_it_started(db_url):
    steps = make_unknown(db_url, 2, hours_ago=3)
    with bulk_waiting_on(db_url, held(steps[1].id), "--older-than", "2h") as (proc, holder):
        # Matches the filter (and would sort first), but became unknown after the bulk close started.
        [late] = make_unknown(db_url, hours_ago=5)
        holder.rollback()
        out = finish(proc, expect=0)
    assert [(r["id"], r["outcome"]) for r in out["data"]["results"]] == [(s.id, "succeeded") for s in steps]
    assert step_row(db_url, late.id)["status"] == "unknown"


def test_a_bulk_resolve_refuses_a_blank_filter_instead_of_dropping_it(db_url):
    """Fail closed: `--search ""` read as no search would close every unknown row."""
    make_unknown(db_url, 2, hours_ago=1)
    reader = Evq(db_url)
    flags = ("steps", "resolve", "--status", "unknown", "--as", "accepted", "--note", "n", "--dry-run", "-o", "json")
    for flag, value in (("--search", ""), ("--search", "  "), ("--recipient-domain", ""), ("--run-id", "")):
        done = reader.run(*flags, flag, value)
        assert done.returncode != 0, (flag, value, done.stdout[-500:])
        error = json.loads(done.stdout or done.stderr)["error"]
        assert error["code"] == "E_INVALID_ARG" and flag in json.dumps(error), error
        assert "empty: give a value or leave it out" in json.dumps(error)
    assert len(reader.json("steps", "list", "--status", "unknown")["data"]) == 2  # nothing was closed
