"""Issue 13: an RFC 2047 encoded word with a space inside (``=?utf-8?q?hi =0D=0ABcc:evil@evil.com?=``)
passed validation, header values were not checked for encoded words at all, and the HTTP adapter
sent them to the provider as they were. Lenient decoders (Python's email.header, many mail clients)
decode such words, and the CR/LF in them becomes a header. Every encoded word is now refused
wherever text becomes a header line (subject, display names, addresses, header values), at enqueue
and again in what the adapters are about to send. Driven for real: the CLI as a subprocess, `evq
serve` on a loopback port, a worker sending to a real SMTP server and to a real HTTP provider."""

from __future__ import annotations

import email.header
import json
from dataclasses import replace

import psycopg
import pytest

from evq.adapters.http import HttpProvider
from evq.adapters.postgres.op_runner import run_sync
from evq.adapters.postgres.single_enqueue import enqueue_op
from evq.ops.dev.http import DevHttpServer
from evq.worker.outcomes import Rejected
from evq.worker.ports import SendRequest
from evq.worker.request import payload_digest
from tests.acceptance.conftest import Evq, smtp_env
from tests.support import WIRE_KEYS, request, rows, valid
from tests.web.support import checked, serving

SPACED = "=?utf-8?q?hi =0D=0ABcc:evil@evil.com?="
PLAIN = "=?utf-8?q?x=0D=0ABcc:_evil@evil.com?="
# (where in the request, the field the refusal names)
HOSTILE = [
    ({"subject": SPACED}, "subject"),
    ({"headers": {"Keywords": SPACED}}, "headers.Keywords"),
    ({"headers": {"Comments": PLAIN}}, "headers.Comments"),
    ({"headers": {"In-Reply-To": "<a@b> =?utf-8?b?DQpCY2M6IGV2aWxAZXZpbC5jb20=?="}}, "headers.In-Reply-To"),
    ({"to": [{"email": "ok@example.com", "name": SPACED}]}, "to[0]"),
    ({"to": [f'"{SPACED}" <ok@example.com>']}, "to[0]"),
    ({"cc": ["=?utf-8?q?a=0D=0A?=@example.com"]}, "cc[0]"),
    ({"subject": "=?utf-8?q?unterminated and malformed"}, "subject"),
]
IDS = ["spaced-subject", "spaced-header", "header", "b-in-header", "name", "quoted-name", "address", "malformed"]


def _hostile(n: int, overrides: dict) -> dict:
    return request(run_id="ew", step_id=f"s{n}", **overrides)


def _nothing_written(db_url: str) -> None:
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 0}]


def test_the_cli_refuses_every_encoded_word_naming_its_field(db_url, admin_key):
    evq = Evq(db_url, api_key=admin_key)
    for n, (overrides, field) in enumerate(HOSTILE):
        out = evq.json("enqueue", "--file", "-", input=json.dumps(_hostile(n, overrides)), expect=2)
        fields = out["error"]["context"]["fields"]
        assert [f["field"] for f in fields] == [field], out
        assert "encoded words" in fields[0]["message"]
    # The flags too: --subject and --header.
    out = evq.json(
        "enqueue",
        "--run-id",
        "ew",
        "--step-id",
        "flags",
        "--to",
        "ok@example.com",
        "--from",
        "a@example.org",
        "--subject",
        SPACED,
        "--text",
        "t",
        "--header",
        f"Keywords: {SPACED}",
        expect=2,
    )
    assert sorted(f["field"] for f in out["error"]["context"]["fields"]) == ["headers.Keywords", "subject"]
    assert "header injection" in out["error"]["context"]["fields"][0]["message"]
    _nothing_written(db_url)


def test_the_http_api_refuses_every_encoded_word_with_422(db_url, admin_key):
    with serving(db_url) as served:
        api = served.client(admin_key)
        for n, (overrides, field) in enumerate(HOSTILE):
            answer = api.post("/v1/steps", json=_hostile(n, overrides))
            assert answer.status_code == 422, (field, answer.status_code, answer.text[:300])
            assert [f["field"] for f in checked(answer)["error"]["context"]["fields"]] == [field]
    _nothing_written(db_url)


def _stored_unchecked(db_url: str, step_id: str, **patch) -> None:
    """A row written by something other than the validator (an older evq, a hand-written INSERT)."""
    clean = valid(run_id="ew", step_id=step_id, to=["ok@example.com"])
    payload = {**clean.payload, **patch}
    text, digest = payload_digest(payload)
    with psycopg.connect(db_url) as conn:
        run_sync(conn, enqueue_op(replace(clean, payload=payload, payload_json=text, payload_sha256=digest)))


def test_a_stored_encoded_word_never_reaches_the_smtp_server_as_a_header(db_url, admin_key, smtp):
    _stored_unchecked(db_url, "subject", subject=SPACED)
    _stored_unchecked(db_url, "header", headers={"Keywords": SPACED})
    _stored_unchecked(db_url, "clean")
    evq = Evq(db_url, api_key=admin_key)
    done = evq.run("worker", "run", "--drain", **smtp_env(smtp))
    assert done.returncode == 0, done.stderr[-2000:]
    states = {
        r["step_id"]: (r["status"], r["reason"]) for r in rows(db_url, "SELECT step_id, status, reason FROM steps_now")
    }
    assert states == {
        "subject": ("rejected", "policy_refused"),
        "header": ("rejected", "policy_refused"),
        "clean": ("accepted", "provider_accepted"),
    }, states
    [arrived] = smtp.messages
    assert arrived["rcpt_tos"] == ["ok@example.com"]
    # Decoded as leniently as any reader would: no header but the ones evq wrote.
    message = email.message_from_bytes(arrived["data"])
    for name, value in message.items():
        decoded = "".join(
            part.decode(cs or "ascii", "replace") if isinstance(part, bytes) else part
            for part, cs in email.header.decode_header(value)
        )
        assert "\n" not in decoded and "Bcc" not in decoded, (name, decoded)


@pytest.mark.parametrize(
    "patch",
    [{"subject": SPACED}, {"headers": {"Keywords": PLAIN}}, {"reply_to": [{"email": "r@example.com", "name": SPACED}]}],
    ids=["spaced-subject", "header", "reply-to-name"],
)
async def test_the_http_adapter_checks_what_it_is_about_to_send(patch):
    """What the provider would write into the message's headers is checked in the wire body itself."""
    clean = valid(run_id="ew", step_id="http", to=["ok@example.com"])
    with DevHttpServer(api_key="k" * 24) as server:
        provider = HttpProvider(base_url=server.url, api_key="k" * 24, timeout=2, wire_keys=WIRE_KEYS)
        try:
            outcome = await provider.send(
                SendRequest(
                    step_id=1,
                    run_id="ew",
                    idempotency_key=clean.idempotency_key,
                    message_id="<m@example.org>",
                    attempt=1,
                    payload={**clean.payload, **patch},
                )
            )
        finally:
            await provider.close()
        assert isinstance(outcome, Rejected) and outcome.before_send, outcome
        assert "encoded words" in outcome.reason
        assert server.requests == []
