"""Issue 18, the first hour: a worker pointed where nothing listens says why and what to set,
and `--drain` does not call that a success; pointed at the dev sink, it says each send."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from evq.ops.dev.smtp import DevSmtpServer
from tests import contract
from tests.acceptance.conftest import Evq, smtp_env
from tests.acceptance.test_cli import REQUEST
from tests.support import free_port, rows, wait_until


def test_a_drain_where_nothing_listens_exits_6_and_names_the_setting_to_change(evq: Evq):
    evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))
    port = free_port()  # bound and closed again: nothing listens there
    env = {"EVQ_SMTP_HOST": "127.0.0.1", "EVQ_SMTP_PORT": str(port), "EVQ_POLL_INTERVAL": "0.1"}
    done = evq.run("worker", "run", "--drain", "-o", "json", **env)
    assert done.returncode == 6, (done.returncode, done.stdout, done.stderr[-2000:])
    out = json.loads(done.stdout)
    contract.check(("worker", "run"), out)  # the output schema holds the partial_failure too
    assert out["status"] == "partial_failure" and out["data"]["all_failed"] is True
    [failing] = out["data"]["failing"]
    assert failing["cause"] == "connection_refused" and f"127.0.0.1:{port}" in failing["hint"]
    assert "EVQ_SMTP_PORT" in failing["hint"] and "2525" in failing["hint"]
    warnings = [json.loads(line) for line in done.stderr.splitlines() if '"sends_failing"' in line]
    assert len(warnings) == 1 and warnings[0]["level"] == "warning", warnings


def test_the_drains_summary_for_people_says_the_cause_and_the_fix(evq: Evq):
    evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))
    port = free_port()
    done = evq.run("worker", "run", "--drain", EVQ_SMTP_HOST="127.0.0.1", EVQ_SMTP_PORT=str(port))
    assert done.returncode == 6, (done.stdout, done.stderr[-2000:])
    assert done.stdout.startswith("drained: 1 claimed, 1 retryable\nfailing: smtp: 1 attempt in a row failed: "), (
        done.stdout
    )
    assert f"fix: nothing listens on 127.0.0.1:{port}: set EVQ_SMTP_HOST/EVQ_SMTP_PORT" in done.stdout
    assert "every attempt failed: nothing was delivered (exit 6)" in done.stdout


def test_a_drain_through_the_dev_sink_says_each_accepted_send_at_info(evq: Evq, smtp):
    sent = evq.json("enqueue", "--file", "-", input=json.dumps(REQUEST))["data"]
    done = evq.run("worker", "run", "--drain", "-o", "json", EVQ_LOG_LEVEL="info", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    contract.check(("worker", "run"), out)
    assert out["status"] == "success" and out["data"]["outcomes"] == {"accepted": 1} and out["data"]["failing"] == []
    [line] = [json.loads(x) for x in done.stderr.splitlines() if '"send_accepted"' in x]
    assert line["level"] == "info" and line["step"] == sent["id"] and line["provider"] == "smtp"
    assert line["provider_message_id"] and line["to_domain"] == REQUEST["to"][0].rsplit("@", 1)[1].rstrip(">")
    assert REQUEST["to"][0].split("<")[-1].rstrip(">") not in done.stderr and REQUEST["subject"] not in done.stderr


def test_a_drain_after_the_port_is_fixed_says_the_open_circuit_holds_the_steps_then_the_probe_sends_them(
    evq: Evq, db_url: str
):
    """Issue 18: a newcomer drains with a wrong SMTP port (the circuit opens), fixes the port and
    drains again. The circuit, in the database, still holds the steps until its probe is due: that
    drain claims nothing, and must say so (how many wait, the circuit's cause, since when, the next
    probe, what to do) and exit 6, not "nothing to send" and 0. After the probe time a drain sends
    the probe, the circuit closes and the rest go. Real PostgreSQL, the dev SMTP sink on loopback."""
    for n in range(3):
        evq.json("enqueue", "--file", "-", input=json.dumps({**REQUEST, "step_id": f"welcome-{n}"}))
    when = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    later = {**REQUEST, "step_id": "later", "send_at": when}
    evq.json("enqueue", "--file", "-", input=json.dumps(later))
    held = {**REQUEST, "step_id": "held", "require_approval": True}
    evq.json("enqueue", "--file", "-", input=json.dumps(held))
    # A probe far enough away that the two drains below run before it on a loaded machine (at 15 s,
    # one at load 9 reached the probe and sent); the test then moves it to now instead of waiting.
    probe = {
        "EVQ_CIRCUIT_PROBE_BASE": "300",
        "EVQ_CIRCUIT_PROBE_MAX": "300",
        "EVQ_RETRY_BASE": "0",
        "EVQ_RETRY_MAX": "0",
    }
    wrong = free_port()  # bound and closed again: nothing listens there
    env = {"EVQ_SMTP_HOST": "127.0.0.1", "EVQ_SMTP_TIMEOUT": "2", "EVQ_POLL_INTERVAL": "0.1", **probe}
    first = evq.run("worker", "run", "--drain", "-o", "json", EVQ_SMTP_PORT=str(wrong), **env)
    assert first.returncode == 6, (first.stdout, first.stderr[-2000:])
    assert json.loads(first.stdout)["data"]["all_failed"] is True

    with DevSmtpServer() as sink:
        right = {**env, "EVQ_SMTP_PORT": str(sink.port)}
        done = evq.run("worker", "run", "--drain", "-o", "json", **right)
        assert done.returncode == 6, (done.stdout, done.stderr[-2000:])
        out = json.loads(done.stdout)
        contract.check(("worker", "run"), out)
        data = out["data"]
        assert out["status"] == "partial_failure" and data["claimed"] == 0 and data["all_failed"] is False
        [smtp] = data["waiting"]
        assert (smtp["provider"], smtp["due"], smtp["later"], smtp["held"]) == ("smtp", 3, 1, 1)
        assert smtp["next_at"] == when and data["circuit_held"] == 3
        circuit = smtp["circuit"]
        assert (circuit["state"], circuit["reason"]) == ("open", "connection_refused")
        assert circuit["since"] < circuit["next_probe_at"]
        assert sink.messages == []  # the circuit held them: nothing was sent
        logged = [json.loads(x) for x in done.stderr.splitlines() if '"steps_wait_for_circuit"' in x]
        assert len(logged) == 1 and logged[0]["due"] == 3 and logged[0]["level"] == "warning"

        people = evq.run("worker", "run", "--drain", **right)
        assert people.returncode == 6, (people.stdout, people.stderr[-2000:])
        lines = people.stdout.splitlines()
        assert lines[0] == "drained: 0 claimed, nothing to send", lines
        assert lines[1] == (
            f"waiting: smtp: 3 steps wait: circuit for smtp open since {circuit['since']} (connection_refused: "
            f"{circuit['detail']}), next probe at {circuit['next_probe_at']}"
        ), lines
        assert lines[2].startswith("  do: fix the cause, then wait for the probe: `evq worker run --drain` after ")
        assert "No command closes a circuit by hand; `evq providers list` shows it" in lines[2]
        assert lines[3] == f"later: smtp: 1 step scheduled later (send_at or a retry), the first at {when}"
        assert lines[4].startswith("held: smtp: 1 step waits for approval: `evq steps list --status held`")
        assert lines[-1] == "3 steps due left unsent behind an open circuit (exit 6)"

        # After the probe time (brought forward: the clock is not what is tested here): the probe
        # gets through, the circuit closes, the rest go.
        rows(db_url, "UPDATE provider_circuits SET probe_at = now() WHERE provider = 'smtp' RETURNING provider")
        wait_until(lambda: _circuit_probe_due(db_url), timeout=30, interval=0.2)
        sent = evq.run("worker", "run", "--drain", "-o", "json", **right)
        assert sent.returncode == 0, (sent.stdout, sent.stderr[-2000:])
        data = json.loads(sent.stdout)["data"]
        assert data["outcomes"] == {"accepted": 3} and data["circuit_held"] == 0
        assert [(w["due"], w["later"], w["held"], w["circuit"]) for w in data["waiting"]] == [(0, 1, 1, None)]
        assert len(sink.messages) == 3


def _circuit_probe_due(db_url: str) -> bool:
    found = rows(db_url, "SELECT probe_at <= now() AS due FROM provider_circuits WHERE provider = 'smtp'")
    return bool(found and found[0]["due"])
