"""The `evq` command end to end: enqueue, worker, read back, over a real SMTP server."""

from __future__ import annotations

import json
from email import message_from_bytes

from tests.acceptance.conftest import Evq, smtp_env
from tests.support import rows

REQUEST = {
    "run_id": "run-7",
    "step_id": "welcome",
    "to": ["Bob <bob@example.com>"],
    "from": "agent@example.org",
    "subject": "Welcome",
    "text": "Hi Bob",
    "intent": "welcome a new user",
    "decision": {"model": "m-1", "tool": "send_email", "instruction_version": "v3", "rationale": {"why": "signup"},
                 "decided_at": "2026-01-01T09:00:00Z"},
}


def test_enqueue_send_and_read_back_the_whole_story(evq: Evq, smtp, db_url):
    flags = evq.json(
        "enqueue", "--run-id", "run-7", "--step-id", "flags", "--to", "carol@example.com", "--cc", "dan@example.com",
        "--from", "agent@example.org", "--subject", "From flags", "--text", "Hi", "--intent", "test flags",
        "--model", "m-1", "--instruction-version", "v3", "--header", "In-Reply-To: <x@example.com>",
    )["data"]
    assert flags["created"] is True and flags["status"] == "pending" and flags["idempotency_key"] == "run-7:flags"
    first = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    assert set(first) == {"id", "run_id", "step_id", "idempotency_key", "message_id", "status", "created"}

    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    smtp.wait_for(2)
    received = {m["message_id"]: m for m in smtp.messages}
    assert set(received) == {first["message_id"], flags["message_id"]}
    assert smtp.by_message_id() == {first["message_id"]: 1, flags["message_id"]: 1}
    header = message_from_bytes(received[first["message_id"]]["data"])
    assert header["Message-ID"] == first["message_id"] and header["Subject"] == "Welcome"
    assert sorted(received[flags["message_id"]]["rcpt_tos"]) == ["carol@example.com", "dan@example.com"]

    shown = evq.json("steps", "show", str(first["id"]))["data"]
    assert shown["step"]["status"] == "accepted" and shown["step"]["message_id"] == first["message_id"]
    assert shown["decision"]["model"] == "m-1" and shown["decision"]["rationale"] == {"why": "signup"}
    assert [e["kind"] for e in shown["evidence"]] == ["attempt_started", "provider_response"]
    assert shown["evidence"][1]["outcome"] == "accepted" and shown["evidence"][1]["detail"]["code"] == 250

    listed = evq.json("steps", "list", "--run-id", "run-7")
    assert listed["meta"]["total"] == 2 and {s["status"] for s in listed["data"]} == {"accepted"}
    human = evq.run("steps", "list")
    assert human.returncode == 0 and "accepted" in human.stdout and "STATUS" in human.stdout


def test_repeat_returns_the_same_step_and_a_changed_request_is_refused(evq: Evq, db_url):
    first = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    again = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    assert again == {**first, "created": False}
    changed = evq.json("enqueue", "--file", "-", input=json.dumps({**REQUEST, "text": "other"}), expect=3)
    assert changed["error"]["code"] == "E_CONFLICT"
    assert rows(db_url, "SELECT count(*) AS n FROM email_steps")[0]["n"] == 1
    assert rows(db_url, "SELECT count(*) AS n FROM decisions")[0]["n"] == 1


def test_validation_errors_are_field_named_and_write_nothing(evq: Evq, db_url):
    bad = {**REQUEST, "to": ["bob@example.com, eve@example.com"], "subject": "a\r\nBcc: eve@example.com", "x": 1}
    out = evq.json("enqueue", "--file", "-", input=json.dumps(bad), expect=2)
    fields = {f["field"] for f in out["error"]["context"]["fields"]}
    assert {"to[0]", "subject", "x"} <= fields
    assert evq.json("enqueue", "--file", "-", input="{not json", expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert evq.json("enqueue", "--file", "-", input="[" * 100_000, expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert evq.json("enqueue", "--no-such-flag", expect=2)["error"]["code"] == "E_INVALID_ARG"
    human = evq.run("enqueue", "--file", "-", input=json.dumps(bad))
    assert human.returncode == 2 and "to[0]" in human.stderr and human.stdout == ""
    assert rows(db_url, "SELECT count(*) AS n FROM email_steps")[0]["n"] == 0


def test_jsonl_file_enqueues_many_or_none(evq: Evq, db_url, tmp_path):
    lines = [json.dumps({**REQUEST, "step_id": f"bulk-{i}"}) for i in range(5)]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = evq.json("enqueue", "--file", str(path))
    assert out["meta"] == {**out["meta"], "count": 5, "created": 5}
    path.write_text("\n".join(lines[:2] + [json.dumps({**REQUEST, "step_id": "bad", "to": []})]))
    out = evq.json("enqueue", "--file", str(path), expect=2)
    assert out["error"]["context"]["fields"][0]["field"].startswith("[2].")
    assert rows(db_url, "SELECT count(*) AS n FROM email_steps")[0]["n"] == 5


def test_lost_reply_4yz_and_5yz_over_real_smtp(evq: Evq, smtp, db_url):
    ids = {}
    for step, rcpt in (("lost", "lose-reply@example.com"), ("temp", "tempfail@example.com"),
                       ("refused", "reject@example.com"), ("refused-data", "reject-data@example.com")):
        ids[step] = evq.json("enqueue", "--file", "-", input=json.dumps({**REQUEST, "step_id": step, "to": [rcpt]}))["data"]
    done = evq.run("worker", "run", "--drain", "--max-attempts", "2", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    status = {name: evq.json("steps", "show", str(s["id"]))["data"]["step"] for name, s in ids.items()}
    assert status["lost"]["status"] == "unknown" and status["lost"]["reason"] == "ambiguous_response"
    assert smtp.by_message_id().get(ids["lost"]["message_id"]) == 1  # it did arrive, once; evq cannot know
    assert status["temp"]["status"] == "rejected" and status["temp"]["reason"] == "attempts_exhausted"
    assert status["temp"]["attempts"] == 2
    assert status["refused"]["status"] == "rejected" and status["refused"]["reason"] == "provider_rejected"
    assert status["refused-data"]["status"] == "rejected"
    # Running again sends nothing more: the unknown row waits for a person.
    assert evq.run("worker", "run", "--drain", **smtp_env(smtp)).returncode == 0
    assert smtp.by_message_id().get(ids["lost"]["message_id"]) == 1


def test_worker_refuses_a_database_not_at_head(empty_db_url):
    evq = Evq(empty_db_url)
    out = evq.json("worker", "run", "--drain", expect=5)
    assert out["error"]["code"] == "E_SCHEMA_MISMATCH" and "evq db upgrade" in out["error"]["hint"]
    human = evq.run("worker", "run", "--drain")
    assert human.returncode == 5 and "evq db upgrade" in human.stderr
    assert evq.json("db", "upgrade")["data"]["changed"] is True
    assert evq.json("db", "status")["data"]["at_head"] is True


def test_bad_settings_are_clear_errors(evq: Evq):
    out = evq.json("worker", "run", "--drain", "--concurrency", "zero", expect=2)
    assert "EVQ_CONCURRENCY" in out["error"]["message"] or "--concurrency" in out["error"]["message"]
    out = evq.json("worker", "run", "--drain", "--lease-seconds", "5", "--smtp-timeout", "30", expect=2)
    assert "EVQ_LEASE_SECONDS" in out["error"]["message"]
    out = evq.json("worker", "run", "--drain", "--adapter", "pigeon", expect=2)
    assert "pigeon" in out["error"]["message"]


def test_help_explains(evq: Evq):
    for args in (("--help",), ("enqueue", "--help"), ("worker", "run", "--help"), ("steps", "list", "--help")):
        done = evq.run(*args)
        assert done.returncode == 0 and "Usage:" in done.stdout
    assert "EVQ_LEASE_SECONDS" in evq.run("worker", "run", "--help").stdout
