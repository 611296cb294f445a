"""A partial refusal end to end: `evq enqueue`, `evq worker run` against a real Postfix,
then every place a step is shown (CLI JSON and table, HTTP) and the notice its sender gets.

Postfix refuses ``refused@`` and ``refused+bcc@`` (550 5.1.1) and takes the rest; the
notify address is a mailbox on the same Postfix, so the notice is a real delivered mail.
"""

from __future__ import annotations

import json
import re

from tests.acceptance.conftest import Evq, make_key
from tests.realservers.postfix import DOMAIN, Postfix
from tests.web.support import checked, serving


def test_a_partial_refusal_is_shown_everywhere_and_its_sender_is_told(postfix: Postfix, db_url: str) -> None:
    evq = Evq(db_url, api_key=make_key(db_url, "pf-admin", "admin", created_by=None))
    env = {
        "EVQ_SMTP_HOST": "127.0.0.1",
        "EVQ_SMTP_PORT": str(postfix.ports["plain"]),
        "EVQ_SMTP_TIMEOUT": "5",
        "EVQ_LEASE_SECONDS": "30",
        "EVQ_POLL_INTERVAL": "0.1",
        "EVQ_INTERNAL_DOMAINS": DOMAIN,
    }
    request = {
        "run_id": "pf-partial",
        "step_id": "hello",
        "from": "agent@example.org",
        "subject": "Quarterly",
        "to": [f"Ann <ann@{DOMAIN}>", f"refused@{DOMAIN}"],
        "bcc": [f"refused+bcc@{DOMAIN}"],
        "text": "The numbers.\n",
        "notify": f"inbox@{DOMAIN}",
    }

    # Without the setting the validator refuses .test (special-use) recipients outright.
    refused = evq.json("enqueue", "--file", "-", input=json.dumps(request), expect=2)
    assert refused["error"]["code"] == "E_INVALID_ARG"

    step_id = evq.json("enqueue", "--file", "-", input=json.dumps(request), **env)["data"]["id"]
    done = evq.run("worker", "run", "--drain", **env)
    assert done.returncode == 0, done.stderr[-3000:]

    shown = evq.json("steps", "show", str(step_id), **env)["data"]["step"]
    assert shown["status"] == "accepted" and shown["reason"] == "partially_refused"
    assert [(r["recipient"], r["code"]) for r in shown["refused_recipients"]] == [
        (f"refused@{DOMAIN}", 550),
        (f"refused+bcc@{DOMAIN}", 550),
    ]
    assert all("5.1.1" in r["reply"] for r in shown["refused_recipients"])
    table = evq.run("steps", "show", str(step_id), **env).stdout
    assert f"refused         refused@{DOMAIN}: 550" in table

    with serving(db_url, internal_domains=(DOMAIN,)) as api:
        body = checked(api.client(evq.env["EVQ_API_KEY"]).get(f"/v1/steps/{step_id}"))
        web = api.client()
        login = web.get("/ops/login").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', login)
        assert csrf and web.post("/ops/login", data={"csrf": csrf[1], "key": evq.env["EVQ_API_KEY"]}).status_code == 303
        page = web.get(f"/ops/steps/{step_id}").text
    assert body["data"]["step"]["refused_recipients"] == shown["refused_recipients"]
    refused_on_page = re.search(r'<dd id="refused-recipients">(.*?)</dd>', page, re.S)
    assert refused_on_page and f"refused@{DOMAIN}: 550" in refused_on_page[1] and "partially_refused" in page

    # The message reached Ann; the notice reached the notify mailbox, naming who refused and why.
    original = postfix.delivered(shown["message_id"], expect=1)
    assert [m["Delivered-To"] for m in original] == [f"ann@{DOMAIN}"]
    [notice] = postfix.delivered_where(lambda m: m["References"] == shown["message_id"], expect=1)
    assert notice["Delivered-To"] == f"inbox@{DOMAIN}"
    assert notice["Subject"] == "[delivery failed for some recipients] Quarterly"
    text = notice.get_content()
    assert f"refused@{DOMAIN}: 550 5.1.1" in text
    assert "a Bcc recipient: 550" in text and "refused+bcc" not in text  # a notice never shows Bcc addresses
    assert "2 of 3 refused" in text and f"evq steps show {step_id}" in text
