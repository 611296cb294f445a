"""`evq worker run --drain` with EVQ_ADAPTER=ses against moto in server mode: a real worker
process, real PostgreSQL, real HTTP (tests/sesserver.py).

A send is accepted with SES's MessageId and its tag; a reply lost after moto took the
message leaves the step `unknown`, and no later run sends it again (SES has no
idempotency key: a second request would be a second email).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from evq.worker.delivery import KEY_TAG, key_tag
from tests.acceptance.conftest import Evq
from tests.sesserver import ACCESS_KEY, REGION, SECRET_KEY, LostReplyProxy, MotoSes
from tests.support import request, rows


@pytest.fixture
def moto() -> Iterator[MotoSes]:
    with MotoSes() as server:
        yield server


def ses_env(url: str) -> dict[str, str]:
    return {
        "EVQ_ADAPTER": "ses",
        "EVQ_SES_REGION": REGION,
        "EVQ_SES_ENDPOINT_URL": url,
        "EVQ_SES_ACCESS_KEY_ID": ACCESS_KEY,
        "EVQ_SES_SECRET_ACCESS_KEY": SECRET_KEY,
        "EVQ_SES_TIMEOUT": "2",
        "EVQ_LEASE_SECONDS": "30",
        "EVQ_LOG_LEVEL": "debug",
    }


def enqueue(evq: Evq, tmp_path, step_id: str) -> None:
    path = tmp_path / f"{step_id}.jsonl"
    path.write_text(json.dumps(request(run_id="ses", step_id=step_id, provider="ses")))
    evq.json("enqueue", "--file", str(path))


def step(db_url: str) -> dict:
    [row] = rows(db_url, "SELECT * FROM steps_now")
    return row


def answers(db_url: str) -> list[tuple[str, str]]:
    return [
        (r["outcome"], r["to_status"])
        for r in rows(db_url, "SELECT * FROM evidence WHERE kind = 'provider_response' ORDER BY id")
    ]


def test_enqueue_then_a_draining_worker_sends_through_ses_and_the_step_is_accepted(evq: Evq, db_url, moto, tmp_path):
    enqueue(evq, tmp_path, "hello")
    done = evq.run("worker", "run", "--drain", **ses_env(moto.url))
    assert done.returncode == 0, done.stderr[-3000:]
    row = step(db_url)
    [message] = moto.messages()
    assert (row["status"], row["attempts"], row["provider_message_id"]) == ("accepted", 1, message["id"])
    assert answers(db_url) == [("accepted", "accepted")]
    [sent] = moto.sends()
    assert sent["EmailTags"] == [{"Name": KEY_TAG, "Value": key_tag("ses:hello", row["message_id"])}]
    assert f"Message-ID: {row['message_id']}" in message["raw_data"]
    # The worker logged its sends; no credential in any line.
    assert "ses_send_finished" in done.stderr
    assert SECRET_KEY not in done.stderr + done.stdout and ACCESS_KEY not in done.stderr + done.stdout


def test_a_lost_reply_through_a_real_worker_ends_unknown_and_is_never_sent_again(evq: Evq, db_url, moto, tmp_path):
    enqueue(evq, tmp_path, "lost")
    with LostReplyProxy(moto.host, moto.port) as proxy:
        for _ in range(2):
            done = evq.run("worker", "run", "--drain", **ses_env(proxy.url))
            assert done.returncode == 0, done.stderr[-3000:]
            row = step(db_url)
            assert (row["status"], row["reason"], row["attempts"]) == ("unknown", "ambiguous_response", 1), row
            assert row["maybe_delivered"]
        # moto took the message once and answered it; evq never saw the answer nor asked again.
        assert proxy.forwarded == 1
    assert len(moto.messages()) == 1 and row["provider_message_id"] is None
    assert answers(db_url) == [("unknown", "unknown")]
