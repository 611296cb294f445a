"""Issue 18, the first hour: a worker pointed where nothing listens says why and what to set,
and `--drain` does not call that a success; pointed at the dev sink, it says each send."""

from __future__ import annotations

import json

from tests import contract
from tests.acceptance.conftest import Evq, smtp_env
from tests.acceptance.test_cli import REQUEST
from tests.support import free_port


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
