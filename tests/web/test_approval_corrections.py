"""Issue 29: an approver's corrected text reaches the recipients, never beside the agent's HTML.

Most mail clients show a message's HTML part, not its text. A held send is corrected on the ops
page (real form posts to a real `evq serve`, as a browser sends them: the HTML field comes back
filled, with CRLF line ends) and on the command line (a real `evq` process); a real worker then
sends each to a real SMTP server and the MIME received is parsed: the HTML part is the corrected
one or absent, never the original. A corrected text beside an unchanged HTML part is refused on
both, and the step stays held."""

from __future__ import annotations

import asyncio
import html
import re
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

import httpx

from evq.adapters.postgres.store import PostgresStore
from evq.adapters.smtp import SmtpProvider
from evq.ops.dev.smtp import DevSmtpServer
from evq.ops.settings import Settings
from evq.worker.runner import Worker
from tests.acceptance.conftest import Evq, make_key
from tests.support import request, rows, serve_process, step_row

ASKED_TEXT = "Meet on Tuesday.\nBring the slides."
ASKED_HTML = "<p>Meet on <b>Tuesday</b>.</p>\n<p>Bring the slides.</p>"
TEXT = "Meet on Wednesday.\nBring the slides."
HTML = "<p>Meet on <b>Wednesday</b>.</p>\n<p>Bring the slides.</p>"
WORKER = Settings(adapter=("smtp",), concurrency=2, batch_size=4, poll_interval=0.05, smtp_timeout=5)


def _field(page: str, pattern: str) -> str:
    match = re.search(pattern, page, re.S)
    assert match, f"no {pattern!r} on the page"
    return html.unescape(match[1])


def _form(page: str) -> dict[str, str]:
    """What a browser posts back from the approve form left as shown: the CSRF token, the HTML
    field as filled (an HTML parser drops one newline after <textarea>; the browser sends the
    line ends as CRLF) and the digest of what was shown."""
    assert 'name="html"' in page, "the approve form has no HTML field"
    shown = _field(page, r'<textarea name="html"[^>]*>\n?(.*?)</textarea>')
    return {
        "csrf": _field(page, r'name="csrf" value="([^"]+)"'),
        "html": shown.replace("\n", "\r\n"),
        "html_shown": _field(page, r'name="html_shown" value="([^"]*)"'),
    }


def _parts(message: dict[str, Any]) -> dict[str, str]:
    parsed = message_from_bytes(message["data"], policy=policy.default)
    assert isinstance(parsed, EmailMessage)
    parts = parsed.walk() if parsed.is_multipart() else [parsed]
    return {
        p.get_content_type(): p.get_content().replace("\r\n", "\n").rstrip("\n") for p in parts if not p.is_multipart()
    }


async def _drain(db_url: str, sink: DevSmtpServer) -> int:
    store = await PostgresStore.open(db_url, max_size=2)
    smtp = SmtpProvider(host=sink.host, port=sink.port, timeout=5)
    try:
        return await Worker(store, {"smtp": smtp}, WORKER.worker_config()).run(drain=True, install_signals=False)
    finally:
        await smtp.close()
        await store.close()


def test_a_corrected_text_goes_out_with_the_corrected_html_or_none_on_the_page_and_the_cli(db_url):
    agent = make_key(db_url, "bot", "agent", created_by=None)
    alice = make_key(db_url, "alice", "operator")
    with serve_process(db_url) as served:
        with httpx.Client(base_url=served.url, timeout=30, headers={"Authorization": f"Bearer {agent}"}) as api:
            held = {}
            for name in ("page-html", "page-drop", "cli-html"):
                asked = request(run_id="r-fix", step_id=name, text=ASKED_TEXT, html=ASKED_HTML, require_approval=True)
                answer = api.post("/v1/steps", json=asked)
                assert answer.status_code in (200, 201), answer.text
                held[name] = answer.json()["data"]["id"]
        assert {step_row(db_url, i)["status"] for i in held.values()} == {"held"}

        with httpx.Client(base_url=served.url, timeout=30) as web:
            login = web.get("/ops/login").text
            signed = web.post("/ops/login", data={"csrf": _field(login, r'name="csrf" value="([^"]+)"'), "key": alice})
            assert signed.status_code == 303, signed.text[:500]

            step = held["page-html"]
            page = web.get(f"/ops/steps/{step}").text
            form = _form(page)
            # The page shows the HTML part's source, as it would go out.
            assert form["html"].replace("\r\n", "\n") == ASKED_HTML
            approve = f"/ops/steps/{step}/approve"
            note = {"note": "the meeting moved", "text": TEXT}
            refused = web.post(approve, data={**form, **note})
            assert refused.status_code == 422 and "E_INVALID_ARG" in refused.text, refused.text[-800:]
            assert "would go out as the agent wrote it" in html.unescape(refused.text)
            assert step_row(db_url, step)["status"] == "held"
            # The form comes back with what was typed, the HTML field included.
            assert _form(refused.text)["html"].replace("\r\n", "\n") == ASKED_HTML
            done = web.post(approve, data={**form, **note, "html": HTML.replace("\n", "\r\n")})
            assert done.status_code == 303, done.text[-800:]

            step = held["page-drop"]
            form = _form(web.get(f"/ops/steps/{step}").text)
            done = web.post(f"/ops/steps/{step}/approve", data={**form, **note, "drop_html": "on"})
            assert done.status_code == 303, done.text[-800:]

    cli = Evq(db_url, api_key=alice, process=True)
    step = held["cli-html"]
    refused = cli.json("steps", "approve", str(step), "--note", "moved", "--text", TEXT, expect=2)
    assert refused["error"]["code"] == "E_INVALID_ARG"
    assert [e["field"] for e in refused["error"]["context"]["fields"]] == ["html"]
    assert step_row(db_url, step)["status"] == "held"
    done = cli.json("steps", "approve", str(step), "--note", "moved", "--text", TEXT, "--html", HTML)
    assert done["data"]["fields"] == ["text", "html"]

    with DevSmtpServer() as sink:
        assert asyncio.run(_drain(db_url, sink)) == 0
        received = {m["message_id"]: _parts(m) for m in sink.wait_for(3)}
    sent = {name: received[step_row(db_url, i)["message_id"]] for name, i in held.items()}
    assert sent["page-html"] == {"text/plain": TEXT, "text/html": HTML}
    assert sent["page-drop"] == {"text/plain": TEXT}
    assert sent["cli-html"] == {"text/plain": TEXT, "text/html": HTML}
    assert not [p for parts in received.values() for p in parts.values() if "Tuesday" in p]
    for i in held.values():
        [approved] = rows(db_url, "SELECT detail FROM evidence WHERE step_id = %s AND kind = 'approved'", (i,))
        assert approved["detail"]["edited"] and "text" in approved["detail"]["fields"]
        assert "html" in approved["detail"]["fields"]
