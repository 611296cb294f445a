"""The `evq` command end to end: enqueue, worker, read back, over a real SMTP server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from pathlib import Path

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
    "decision": {
        "model": "m-1",
        "tool": "send_email",
        "instruction_version": "v3",
        "rationale": {"why": "signup"},
        "decided_at": "2026-01-01T09:00:00Z",
    },
}


def test_enqueue_send_and_read_back_the_whole_story(evq: Evq, smtp, db_url):
    flags = evq.json(
        "enqueue",
        "--run-id",
        "run-7",
        "--step-id",
        "flags",
        "--to",
        "carol@example.com",
        "--cc",
        "dan@example.com",
        "--from",
        "agent@example.org",
        "--subject",
        "From flags",
        "--text",
        "Hi",
        "--intent",
        "test flags",
        "--model",
        "m-1",
        "--instruction-version",
        "v3",
        "--header",
        "In-Reply-To: <x@example.com>",
    )["data"]
    assert flags["created"] is True and flags["status"] == "pending" and flags["idempotency_key"] == "run-7:flags"
    first = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    assert set(first) == {
        "id",
        "run_id",
        "step_id",
        "idempotency_key",
        "message_id",
        "status",
        "status_label",
        "created",
        "ambiguity",
        "ambiguity_hint",
        "safe_to_retry",
        "next_action",
        "next_action_label",
        "hold",
        "pruned",
        "approval",
    }
    # No approval policy, and an admin key (its approval: policy): it goes out on its own.
    assert first["hold"] is None and first["pruned"] is False and first["approval"] is None
    assert (first["safe_to_retry"], first["next_action"]) == (False, "wait")  # queued: never resend it
    # Plain SMTP can settle no lost answer (docs/design.md, "Provider profiles"): the answer says so.
    assert first["ambiguity"] == "unresolvable" and "EVQ_REFUSE_UNRESOLVABLE" in first["ambiguity_hint"]

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
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 1
    assert rows(db_url, "SELECT count(*) AS n FROM decisions")[0]["n"] == 1


def test_validation_errors_are_field_named_and_write_nothing(evq: Evq, db_url):
    bad = {**REQUEST, "to": ["bob@example.com, eve@example.com"], "subject": "a\r\nBcc: eve@example.com", "x": 1}
    out = evq.json("enqueue", "--file", "-", input=json.dumps(bad), expect=2)
    fields = {f["field"] for f in out["error"]["context"]["fields"]}
    assert {"to[0]", "subject", "x"} <= fields
    assert evq.json("enqueue", "--file", "-", input="{not json", expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert evq.json("enqueue", "--file", "-", input="[" * 100_000, expect=2)["error"]["code"] == "E_INVALID_ARG"
    assert evq.json("enqueue", "--no-such-flag", expect=2)["error"]["code"] == "E_INVALID_ARG"
    twice = evq.json(
        "enqueue",
        "--run-id",
        "r",
        "--step-id",
        "s",
        "--to",
        "a@example.com",
        "--from",
        "agent@example.org",
        "--subject",
        "s",
        "--text",
        "t",
        "--header",
        "References: <a@b>",
        "--header",
        "References: <c@d>",
        expect=2,
    )  # not silently the last one
    assert twice["error"]["context"]["fields"] == [
        {"field": "--header", "message": "References given twice; give it once"}
    ]
    human = evq.run("enqueue", "--file", "-", input=json.dumps(bad))
    assert human.returncode == 2 and "to[0]" in human.stderr and human.stdout == ""
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0


def test_jsonl_file_enqueues_many_or_none(evq: Evq, db_url, tmp_path):
    lines = [json.dumps({**REQUEST, "step_id": f"bulk-{i}"}) for i in range(5)]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = evq.json("enqueue", "--file", str(path))
    assert out["meta"] == {**out["meta"], "count": 5, "created": 5}
    path.write_text("\n".join([*lines[:2], json.dumps({**REQUEST, "step_id": "bad", "to": []})]))
    out = evq.json("enqueue", "--file", str(path), expect=2)
    assert out["error"]["context"]["fields"][0]["field"].startswith("[2].")
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 5


def test_lost_reply_4yz_and_5yz_over_real_smtp(evq: Evq, smtp, db_url):
    ids = {}
    for step, rcpt in (
        ("lost", "lose-reply@example.com"),
        ("temp", "tempfail@example.com"),
        ("refused", "reject@example.com"),
        ("refused-data", "reject-data@example.com"),
    ):
        ids[step] = evq.json("enqueue", "--file", "-", input=json.dumps({**REQUEST, "step_id": step, "to": [rcpt]}))[
            "data"
        ]
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp, EVQ_MAX_ATTEMPTS="2"))
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
    for args in (("--help",), ("steps", "enqueue", "--help"), ("enqueue", "--help"), ("worker", "run", "--help")):
        done = evq.run(*args)
        assert done.returncode == 0 and "Usage:" in done.stdout
    # worker run's help fits a screen: its everyday settings with their variables, and where every
    # other one is (EVQ_LEASE_SECONDS among them, a flag all the same: tests/unit/test_cli_help.py).
    worker_help = " ".join(evq.run("worker", "run", "--help").stdout.split())
    assert "EVQ_CONCURRENCY" in worker_help and "more settings are flags too (docs/settings.md)" in worker_help
    assert (
        "`EVQ_LEASE_SECONDS` | `--lease-seconds`"
        in (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    )
    # The old spellings run the same commands, named as aliases, and stay out of the listing.
    assert "Alias of `evq steps enqueue`" in evq.run("enqueue", "--help").stdout
    listed = {
        line.split()[0] for line in evq.run("--help").stdout.split("Commands:")[1].splitlines() if line[:3].strip()
    }
    assert listed == {
        "admin",
        "deliveries",
        "events",
        "keys",
        "policy",
        "providers",
        "refusals",
        "runs",
        "schema",
        "steps",
        "worker",
    }


FULL_REQUEST = {
    "run_id": "run-full",
    "step_id": "every-field",
    "idempotency_key": "full-key-1",
    "to": ["Ada <ada@example.com>", "bob@example.com"],
    "cc": ["Cy <cy@example.net>"],
    "bcc": ["dee@example.org"],
    "from": "Agent <agent@example.org>",
    "reply_to": ["help@example.org"],
    "subject": "Every field",
    "text": "plain body",
    "html": "<p>html body</p>",
    "headers": {"In-Reply-To": "<prev@example.com>", "References": "<root@example.com> <prev@example.com>"},
    "intent": "exercise every flag",
    "notify": "ops@example.org",
    "provider": "smtp",
    "max_attempts": 4,
    "require_approval": True,
    "priority": "high",
    # A month ahead (a send_at is at most a year away).
    "send_at": (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0).isoformat(),
    "decision": {
        "instruction_version": "v9",
        "prompt_version": "p2",
        "model": "m-9",
        "tool": "send_email",
        "rationale": {"why": "every field", "n": 1},
        "decided_at": "2026-01-02T03:04:05+00:00",
    },
}


def _as_flags(request: dict) -> list[str]:
    """The request spelt as `evq enqueue` flags, one flag per field (repeatable ones repeated)."""
    args: list[str] = []
    for name, value in request.items():
        if name == "decision":
            for field, v in value.items():
                args += ["--" + field.replace("_", "-"), json.dumps(v) if isinstance(v, dict) else v]
        elif name == "headers":
            for header, v in value.items():
                args += ["--header", f"{header}: {v}"]
        elif value is True:
            args += ["--" + name.replace("_", "-")]
        else:
            for v in value if isinstance(value, list) else [value]:
                args += ["--" + name.replace("_", "-"), str(v)]
    return args


def test_every_request_field_has_a_flag_and_the_flags_make_the_same_request(evq: Evq, db_url):
    from evq.worker.request import DECISION_FIELDS, REQUEST_FIELDS

    # Every field of the request and of its decision appears in FULL_REQUEST, so each has its flag below.
    assert set(FULL_REQUEST) == set(REQUEST_FIELDS) and set(FULL_REQUEST["decision"]) == set(DECISION_FIELDS)
    by_file = evq.json("enqueue", "--file", "-", input=json.dumps(FULL_REQUEST))["data"]
    assert by_file["created"] is True
    # The same request from flags is the same request: the step comes back, nothing new is written.
    by_flags = evq.json("enqueue", *_as_flags(FULL_REQUEST))["data"]
    assert by_flags == {**by_file, "created": False}

    # And the flags alone store every field: a fresh step from flags only, read back.
    alone = {**FULL_REQUEST, "step_id": "flags-only", "idempotency_key": "full-key-2"}
    made = evq.json("enqueue", *_as_flags(alone))["data"]
    assert made["created"] is True and made["idempotency_key"] == "full-key-2"
    shown = evq.json("steps", "show", str(made["id"]))["data"]
    payload, step, decision = shown["step"]["payload"], shown["step"], shown["decision"]
    assert [a["email"] for a in payload["to"]] == ["ada@example.com", "bob@example.com"]
    assert payload["to"][0]["name"] == "Ada" and payload["cc"] == [{"email": "cy@example.net", "name": "Cy"}]
    assert [a["email"] for a in payload["bcc"]] == ["dee@example.org"]
    assert [a["email"] for a in payload["reply_to"]] == ["help@example.org"]
    assert payload["from"] == {"email": "agent@example.org", "name": "Agent"}
    assert (payload["subject"], payload["text"], payload["html"]) == ("Every field", "plain body", "<p>html body</p>")
    assert payload["headers"] == FULL_REQUEST["headers"]
    assert (step["notify"], step["provider"], step["max_attempts"]) == ("ops@example.org", "smtp", 4)
    assert decision["intent"] == "exercise every flag"
    assert {k: decision[k] for k in FULL_REQUEST["decision"]} == FULL_REQUEST["decision"]
    assert step["status"] == "held" and step["hold"]["rules"][0]["rule"] == "requested"  # --require-approval
    assert step["priority"] == 1 and step["send_at"] == FULL_REQUEST["send_at"]


def test_a_repeat_is_the_same_message_under_the_same_key_and_the_first_settings_stand(evq: Evq, db_url):
    """What "the same request" compares (docs/how-a-send-moves.md, "Enqueue"): the message (addresses, subject,
    bodies, headers) under the key, and the provider (another provider is another send:
    tests/acceptance/test_provider_profiles.py). A repeat's notify, max_attempts and decision are
    not compared: the first enqueue's stand, and the repeat writes nothing."""
    first = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    repeat = {
        **REQUEST,
        "notify": "boss@example.org",
        "max_attempts": 9,
        "intent": "changed",
        "decision": {**REQUEST["decision"], "model": "m-2"},
    }
    assert evq.json("enqueue", "--file", "-", input=json.dumps(repeat))["data"] == {**first, "created": False}
    row = rows(db_url, "SELECT notify, max_attempts FROM steps_now")
    assert row == [{"notify": None, "max_attempts": None}]
    assert rows(db_url, "SELECT model FROM decisions") == [{"model": "m-1"}]


def test_steps_list_filters_by_provider_age_and_recipient_domain(db_url):
    from datetime import datetime, timedelta

    from tests.support import unknown_steps, valid, with_store

    def unknown(hours_ago: float, **request) -> int:
        at = datetime.now(UTC) - timedelta(hours=hours_ago)
        return with_store(db_url, lambda store: unknown_steps(store, now=at, **request))[0].id

    old = unknown(5, to=["a@Example.NET"])
    middle = unknown(3, to=["b@example.com"], cc=["c@example.net"])
    recent = unknown(0.5, to=["d@example.com"], bcc=["e@example.net"])
    pending = with_store(db_url, lambda store: store.enqueue(valid(provider="null", to=["f@example.org"]))).id
    reader = Evq(db_url)

    def ids(*flags: str) -> list[int]:
        out = reader.json("steps", "list", *flags)
        assert out["meta"]["total"] == len(out["data"]) == out["meta"]["count"]
        return [s["id"] for s in out["data"]]

    # Unknown rows oldest first, each with its age since it became unknown.
    unknowns = reader.json("steps", "list", "--status", "unknown")["data"]
    assert [s["id"] for s in unknowns] == [old, middle, recent]
    assert unknowns[0]["age_seconds"] >= 5 * 3600 - 60 and unknowns[2]["age_seconds"] < 3600
    assert ids("--older-than", "2h", "--status", "unknown") == [old, middle]
    assert ids("--older-than", "240m") == [old]
    assert ids("--older-than", "1d") == []
    # A recipient at the domain in to, cc or bcc; the domain compared without case.
    assert ids("--recipient-domain", "example.net") == [old, middle, recent]
    assert ids("--recipient-domain", "EXAMPLE.org") == [pending]
    assert ids("--provider", "null") == [pending]
    # Stored with a Unicode domain; found by it, whatever its case, and by the xn-- form a log shows.
    idn = with_store(db_url, lambda store: store.enqueue(valid(to=["x@bücher.example"]))).id
    assert ids("--recipient-domain", "BÜCHER.example") == ids("--recipient-domain", "xn--bcher-kva.example") == [idn]
    assert ids("--provider", "smtp", "--recipient-domain", "example.com", "--older-than", "1h") == [middle]
    # The search box's string: an address whatever its case, its @domain, or a bare domain.
    assert ids("--search", "A@EXAMPLE.net") == [old]
    assert ids("--search", "example.org") == ids("--search", "@example.org") == [pending]
    assert ids("--search", "b@example.com", "--status", "pending") == []
    assert "1 of 1" in reader.run("steps", "list", "--search", "f@example.org", "-o", "table").stdout
    page = reader.json("steps", "list", "--status", "unknown", "--limit", "1", "--offset", "1")
    assert [s["id"] for s in page["data"]] == [middle]
    assert page["meta"] == {**page["meta"], "count": 1, "total": 3, "limit": 1, "offset": 1}


def test_worker_refuses_a_database_behind_this_evq(empty_db_url):
    """A database 0.2.0 made (revision 0012_step_guard): refused until `evq db upgrade`."""
    from evq.adapters.postgres.database import head_revision
    from tests.v0_2 import REVISION, database_0_2

    database_0_2(empty_db_url)
    behind = REVISION
    evq = Evq(empty_db_url)
    out = evq.json("worker", "run", "--drain", "--adapter", "null", expect=5)
    assert out["error"]["code"] == "E_SCHEMA_MISMATCH" and "evq db upgrade" in out["error"]["hint"]
    assert out["error"]["context"] == {"current": behind, "expected": head_revision()}
    human = evq.run("worker", "run", "--drain", "--adapter", "null")
    assert human.returncode == 5 and behind in human.stderr and "evq db upgrade" in human.stderr
    assert evq.json("db", "upgrade")["data"]["changed"] is True
    assert evq.run("worker", "run", "--drain", "--adapter", "null").returncode == 0


def test_logs_are_json_off_a_terminal_and_every_line_of_a_send_names_it(evq: Evq, smtp):
    sent = evq.json("enqueue", "--file", "-", input=json.dumps({**REQUEST, "to": ["lose-reply@example.com"]}))["data"]
    done = evq.run("worker", "run", "--drain", EVQ_LOG_FORMAT="auto", EVQ_LOG_LEVEL="debug", **smtp_env(smtp))
    # stdout holds the drain's summary for people, never a log line.
    assert done.returncode == 0 and done.stdout.startswith("drained: 1 claimed, 1 unknown"), done.stdout
    assert "{" not in done.stdout, done.stdout
    lines = [json.loads(line) for line in done.stderr.splitlines()]  # every line is one JSON object
    of_the_send = [e for e in lines if e.get("step") == sent["id"]]
    # The adapter's own line and the worker's: both carry the send's identity.
    assert {"smtp_send_finished", "send_recorded"} <= {e["event"] for e in of_the_send}
    for event in of_the_send:
        assert (event["run_id"], event["step_id"], event["idempotency_key"], event["attempt"]) == (
            "run-7",
            "welcome",
            sent["idempotency_key"],
            1,
        ), event


def test_logs_are_readable_on_a_terminal(evq: Evq):
    import os
    import pty
    import subprocess

    controller, terminal = pty.openpty()
    try:
        done = subprocess.run(
            evq.cmd("worker", "run", "--drain", "--adapter", "null"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=terminal,
            env={**evq.env, "EVQ_LOG_FORMAT": "auto"},
            timeout=60,
        )
        os.close(terminal)
        terminal = -1
        seen = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's other end is closed: everything was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    # stdout holds only the drain's summary for people (nothing was queued); the logs are on the terminal.
    assert done.returncode == 0 and done.stdout == b"drained: 0 claimed, nothing to send\n", done.stdout
    text = seen.decode()
    assert "worker_started" in text and "worker_stopped" in text
    assert not any(line.lstrip().startswith("{") for line in text.splitlines() if line.strip())


def test_recipient_domains_and_the_size_limit_come_from_the_settings(evq: Evq, smtp, db_url):
    def refused(env: dict, **change) -> dict:
        out = evq.json("enqueue", "--file", "-", input=json.dumps({**REQUEST, **change}), expect=2, **env)
        return {f["field"]: f["message"] for f in out["error"]["context"]["fields"]}

    assert "not in the allowed domains" in refused({"EVQ_ALLOWED_DOMAINS": "example.org"})["to[0]"]
    assert "blocked" in refused({"EVQ_BLOCKED_DOMAINS": "example.com"}, cc=["x@EXAMPLE.com"])["cc[0]"]
    assert "over the limit" in refused({"EVQ_MAX_MESSAGE_BYTES": "2048"}, text="x" * 3000)["text"]
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
    # Enqueued while allowed, refused at send time once the settings block it: nothing leaves.
    step = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp, EVQ_BLOCKED_DOMAINS="example.com"))
    assert done.returncode == 0, done.stderr[-2000:]
    shown = evq.json("steps", "show", str(step["id"]))["data"]["step"]
    assert shown["status"] == "rejected" and "blocked" in json.dumps(shown["detail"]) and smtp.messages == []


def test_a_database_a_newer_evq_migrated_is_refused_with_the_right_advice(db_url):
    """An older evq (a worker not yet upgraded) meets a database at a revision it does not know:
    `evq db upgrade` cannot fix that, so no command says it would, and none crashes."""
    from tests.support import execute

    execute(db_url, "UPDATE alembic_version SET version_num = '9999_from_the_future'")
    evq = Evq(db_url)
    for args in (
        ("worker", "run", "--drain", "--adapter", "null"),
        ("db", "upgrade"),
        ("db", "upgrade", "--dry-run"),
        ("db", "status"),
    ):
        error = evq.json(*args, expect=5)["error"]
        assert error["code"] == "E_SCHEMA_MISMATCH" and "9999_from_the_future" in error["message"], args
        assert "newer evq" in error["hint"] and "never goes back" in error["hint"], args
    assert rows(db_url, "SELECT version_num FROM alembic_version") == [{"version_num": "9999_from_the_future"}]


def test_a_duration_too_long_for_a_date_is_a_field_error_not_a_crash(evq: Evq):
    for args in (
        ("steps", "list"),
        ("prune", "--dry-run"),
        ("steps", "resolve", "--status", "unknown", "--as", "rejected", "--note", "n", "--dry-run"),
    ):
        out = evq.json(*args, "--older-than", "1000000d", expect=2)
        assert out["error"]["context"]["fields"][0]["field"] == "--older-than", args
    assert evq.json("steps", "list", "--older-than", "36500d")["meta"]["total"] == 0


def test_out_of_range_numbers_and_bytes_that_are_not_utf8_are_argument_errors(evq: Evq):
    """Refused as bad arguments (exit 2), never an E_INTERNAL from the database or the encoder."""
    import os

    huge = str(2**64)
    for args in (
        ("steps", "show", huge),
        ("steps", "resolve", huge, "--as", "rejected", "--note", "n"),
        ("steps", "list", "--offset", huge),
        ("steps", "resolve", "--status", "unknown", "--as", "rejected", "--note", "n", "--limit", huge),
    ):
        assert evq.json(*args, expect=2)["error"]["code"] == "E_INVALID_ARG", args
    not_utf8 = os.fsdecode(b"run-\xff")
    for args in (
        ("steps", "list", "--run-id", not_utf8),
        ("runs", "show", not_utf8),
        ("steps", "resolve", "--status", "unknown", "--provider", not_utf8, "--as", "rejected", "--note", "n"),
    ):
        error = evq.json(*args, expect=2)["error"]
        assert error["code"] == "E_INVALID_ARG" and "not valid UTF-8" in error["message"], args
    human = evq.run("runs", "show", not_utf8)
    assert human.returncode == 2 and "not valid UTF-8" in human.stderr


def test_a_refused_enqueue_is_recorded_and_listed_and_a_database_away_changes_no_answer(evq: Evq, db_url):
    """EVQ_REQUIRE_PROVENANCE on the command line: the refusal names decision.model, is
    recorded with the key's name (interface cli), and `evq refusals list` shows it."""
    env = {"EVQ_REQUIRE_PROVENANCE": "model,instruction_version"}
    bad = {**REQUEST, "decision": {"instruction_version": "v1"}}
    out = evq.json("enqueue", "--file", "-", input=json.dumps(bad), expect=2, **env)
    assert [f["field"] for f in out["error"]["context"]["fields"]] == ["decision.model"]
    assert rows(db_url, "SELECT count(*) AS n FROM steps_now")[0]["n"] == 0
    listed = evq.json("refusals", "list", "--interface", "cli")
    [row] = listed["data"]
    assert (row["key_name"], row["interface"], row["reasons"]) == ("test-admin", "cli", ["decision"])
    assert row["errors"] == out["error"]["context"]["fields"] and REQUEST["text"] not in json.dumps(row)
    assert evq.json("refusals", "list", "--key", "someone-else")["data"] == []
    human = evq.run("refusals", "list")
    assert human.returncode == 0 and "decision.model" in human.stdout
    # With the database unreachable the refusal is still the answer, unchanged.
    away = Evq("postgresql://postgres@127.0.0.1:1/nowhere", **env)
    gone = away.json("enqueue", "--file", "-", input=json.dumps(bad), expect=2)
    assert gone["error"]["context"]["fields"] == out["error"]["context"]["fields"]
