"""Issue 13: a failure notice listed the original's Bcc recipients, to whoever `notify` named. The
notice now gives their number only, and a provider's answer quoted in it (a refusal naming a refused
recipient) has the Bcc addresses taken out. Driven for real: the CLI enqueues, a worker sends to a real
SMTP server that refuses, and the notice is read as it arrived there."""

from __future__ import annotations

import email
import email.policy
import json

import pytest

from tests.acceptance.conftest import smtp_env
from tests.support import request, rows

NOTIFY = "owner@example.com"


def _arrived_notice(smtp) -> str:
    [notice] = [m for m in smtp.messages if m["rcpt_tos"] == [NOTIFY]]
    message = email.message_from_bytes(notice["data"], policy=email.policy.default)
    assert message["Auto-Submitted"] == "auto-generated"
    return message.get_body(("plain",)).get_content()


@pytest.mark.parametrize(
    "to,bcc",
    [
        # 554 after the final ".": the whole message refused.
        (["reject-data@example.com"], ["Secret Sam <sam@hidden.example>", "kim@hidden.example"]),
        # 550 at RCPT for every recipient, the Bcc one too: the refusal quotes the refused addresses.
        (["reject@example.com"], ["Secret Sam <reject+sam@hidden.example>", "reject+kim@hidden.example"]),
    ],
    ids=["refused-after-data", "every-recipient-refused"],
)
def test_the_notice_of_a_refused_send_never_shows_its_bcc_recipients(evq, db_url, smtp, to, bcc):
    data = request(run_id="bcc", step_id="s", to=to, bcc=bcc, notify=NOTIFY)
    evq.json("enqueue", "--file", "-", input=json.dumps(data))
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    [original] = rows(db_url, "SELECT status, detail FROM steps_now WHERE step_id = 's'")
    assert original["status"] == "rejected", original
    body = _arrived_notice(smtp)
    assert "Bcc:         2 recipients, not listed" in body, body
    for hidden in ("Secret Sam", "sam@hidden.example", "kim@hidden.example", "hidden.example"):
        assert hidden not in body, (hidden, body)
    assert to[0] in body  # the visible recipients are still named


def test_a_provider_answer_quoting_a_bcc_recipient_is_shown_without_it():
    """A refusal that names a Bcc recipient (a server refusing one RCPT says which), in the stored
    Unicode form or the ASCII form the server answers with, in any case."""
    from evq.worker.notices import notice_text

    text = notice_text(
        {
            "id": 3,
            "run_id": "r",
            "step_id": "s",
            "idempotency_key": "r:s",
            "message_id": "<m@example.org>",
            "provider": "smtp",
            "status": "rejected",
            "reason": "provider_rejected",
            "attempts": 1,
            "notify": NOTIFY,
            "detail": "550 <Sam@XN--BCHER-KVA.example>: no such user; 550 <ann@example.com>: over quota",
            "payload": {
                "from": {"email": "agent@example.org", "name": None},
                "subject": "Hi",
                "to": [{"email": "ann@example.com", "name": None}],
                "bcc": [{"email": "sam@bücher.example", "name": "Sam"}],
            },
        }
    )
    assert "bücher" not in text.lower() and "xn--bcher-kva" not in text.lower() and "sam@" not in text.lower()
    assert "550 <(a Bcc recipient)>: no such user; 550 <ann@example.com>: over quota" in text
    assert "Bcc:         1 recipient, not listed" in text
