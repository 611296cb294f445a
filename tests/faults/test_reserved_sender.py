"""Issue 13: the reserved-sender check (failure notices come from ``evq-notices@``, or EVQ_NOTICE_FROM)
compared lower-cased strings, so ``evq-notices+x@``, a Unicode hyphen (U+2010, U+2011, U+2212), the
fullwidth forms and a display name showing the address (``"evq-notices@host" <x@y>``) all passed: a
caller could send mail that reads as evq's own notice. Each is now refused at enqueue (NFKC, case
folding, hyphen look-alikes, subaddresses), through the real CLI and the Python API on a real database."""

from __future__ import annotations

import psycopg
import pytest

from evq.adapters.postgres.enqueue import enqueue
from evq.worker.errors import InvalidRequest
from evq.worker.request import Policy
from tests.acceptance.conftest import Evq
from tests.support import request, rows

LOOK_ALIKES = [
    "evq-notices+x@example.org",
    "EVQ-Notices@Example.org",
    "evq\u2010notices@example.org",  # HYPHEN
    "evq\u2011notices@example.org",  # NON-BREAKING HYPHEN
    "evq\u2212notices@example.org",  # MINUS SIGN
    "evq\u2013notices@example.org",  # EN DASH
    "\uff45\uff56\uff51\uff0d\uff4e\uff4f\uff54\uff49\uff43\uff45\uff53@example.org",  # fullwidth
    '"evq-notices@example.org" <agent@example.org>',
    '"EVQ\u2010NOTICES" <agent@example.org>',
    {"email": "agent@example.org", "name": "evq-notices\uff20example.org"},  # fullwidth @ in a name
    # Letters of other scripts that look like Latin ones (Unicode's confusables, UTS #39).
    "\u0435vq-notices@example.org",  # CYRILLIC SMALL LETTER IE for "e"
    "evq-n\u043etices@example.org",  # CYRILLIC SMALL LETTER O for "o"
    "\u0395VQ-\u039dOTICES@example.org",  # GREEK CAPITAL EPSILON and NU for "E" and "N"
    "evq-notic\u0435s@example.org",  # CYRILLIC SMALL LETTER IE for the second "e"
    '"\u0435vq-notices@example.org" <agent@example.org>',  # the same, in a display name
    {"email": "agent@example.org", "name": "\u0435vq-n\u03bftices"},  # Cyrillic e, Greek omicron
]
IDS = [
    "plus",
    "case",
    "u2010",
    "u2011",
    "u2212",
    "en-dash",
    "fullwidth",
    "name-address",
    "name-hyphen",
    "name-fullwidth-at",
    "cyrillic-e",
    "cyrillic-o",
    "greek-capitals",
    "cyrillic-e-2",
    "name-cyrillic",
    "name-mixed-scripts",
]
# Other senders, however close: a local part that only starts the same is another mailbox.
FINE = [
    "agent@example.org",
    "Evq Agent <agent@example.org>",
    "notices@example.org",
    "evq-noticesx@example.org",
    "evq-notices-team@example.org",
    "\u0434\u0438\u043c\u0430@example.org",
]  # a Cyrillic name is just a name


@pytest.mark.parametrize("sender", LOOK_ALIKES, ids=IDS)
def test_every_look_alike_of_the_notice_sender_is_refused(db_url, sender):
    with psycopg.connect(db_url) as conn, pytest.raises(InvalidRequest) as refused:
        enqueue(conn, request(run_id="rs", step_id="s", **{"from": sender}))
    assert [f["field"] for f in refused.value.context["fields"]] == ["from"]
    assert "reserved" in refused.value.context["fields"][0]["message"]
    with psycopg.connect(db_url) as conn:
        for n, fine in enumerate(FINE):
            enqueue(conn, request(run_id="rs", step_id=f"ok{n}", **{"from": fine}))
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": len(FINE)}]


def test_the_cli_refuses_look_alikes_of_the_configured_notice_sender(db_url, admin_key):
    evq = Evq(db_url, api_key=admin_key, EVQ_NOTICE_FROM="alerts@corp.example")
    for n, sender in enumerate(
        [
            "Alerts+1@CORP.example",
            "\uff41lerts@corp.example",
            '"ALERTS@corp.example" <agent@example.org>',
            "ALERTS@corp.example",
        ]
    ):
        out = evq.json(
            "enqueue",
            "--run-id",
            "rs",
            "--step-id",
            f"c{n}",
            "--to",
            "ok@example.com",
            "--from",
            sender,
            "--subject",
            "s",
            "--text",
            "t",
            expect=2,
        )
        assert [f["field"] for f in out["error"]["context"]["fields"]] == ["from"], (sender, out)
    # Another domain's "alerts" is not the notice sender.
    evq.json(
        "enqueue",
        "--run-id",
        "rs",
        "--step-id",
        "other",
        "--to",
        "ok@example.com",
        "--from",
        "alerts@other.example",
        "--subject",
        "s",
        "--text",
        "t",
    )
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 1}]


def test_evq_itself_may_still_send_its_notices():
    from evq.worker.notices import NoticeConfig, build_notice

    notice = build_notice(
        {
            "id": 1,
            "run_id": "r",
            "step_id": "s",
            "idempotency_key": "r:s",
            "message_id": "<m@x>",
            "provider": "smtp",
            "status": "rejected",
            "reason": "provider_rejected",
            "detail": "550",
            "attempts": 1,
            "notify": "owner@example.com",
            "payload": {
                "from": {"email": "agent@example.org", "name": None},
                "subject": "Hi",
                "to": [{"email": "a@example.com", "name": None}],
            },
        },
        NoticeConfig(),
    )
    assert notice.payload["from"]["email"] == "evq-notices@example.org"
    assert Policy().reserved_senders == ("evq-notices@",)
