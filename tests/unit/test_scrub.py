"""The core's scrubbing boundary: whatever an adapter lets through, no registered secret
reaches an outcome (and so a step's reason, detail, outputs or a notice), in any common encoding."""

from __future__ import annotations

import asyncio
import base64
import json
from urllib.parse import quote, quote_plus

from evq.worker import executor
from evq.worker.outcomes import Rejected
from evq.worker.ports import SendRequest
from evq.worker.secret_scrub import register, scrub, scrub_event, scrub_text

SECRET = "unit-Scrub+Secret/9f2=x"


class _Leaky:
    """An adapter that scrubs nothing and puts the key in every field it answers with."""

    name = "leaky"
    dedupe_window = None

    async def send(self, request):
        return Rejected(
            f"401: Bearer {SECRET}",
            response={"body": json.dumps({"m": SECRET}).replace("/", "\\/"), "nested": [{"u": quote(SECRET, safe="")}]},
        )

    async def close(self):
        pass


def test_the_executor_scrubs_what_an_adapter_let_through():
    register([SECRET])
    request = SendRequest(step_id=1, run_id="r", idempotency_key="r:s", message_id="<m@x>", attempt=1, payload={})
    outcome, _ = asyncio.run(executor.attempt(_Leaky(), request, deadline=5))
    text = json.dumps([outcome.reason, outcome.response])
    assert "***" in outcome.reason and "401" in outcome.reason
    for form in (SECRET, SECRET.replace("/", "\\/"), quote(SECRET, safe="")):
        assert form not in text


def test_every_common_encoding_is_scrubbed():
    register([SECRET])
    raw = SECRET.encode()
    cases = [
        SECRET,
        SECRET.upper(),
        json.dumps(SECRET)[1:-1].replace("/", "\\/"),
        quote(SECRET, safe=""),
        quote_plus(SECRET),
        "".join(f"\\u{ord(c):04x}" for c in SECRET),
    ]
    # base64 of the secret inside a longer blob, at every alignment (Basic auth, a Bearer header, AUTH PLAIN)
    for prefix in (b"", b":", b"u:", b"user:", b"Bearer ", b"\0evq\0"):
        for suffix in (b"", b"!", b"!!"):
            for enc in (base64.b64encode, base64.urlsafe_b64encode):
                cases.append(enc(prefix + raw + suffix).decode())
    for case in cases:
        clean = scrub_text(f"before {case} after")
        assert clean.startswith("before ") and clean.endswith(" after") and "***" in clean, case
    assert scrub_text("nothing secret here") == "nothing secret here"


def test_third_party_stdlib_logging_goes_through_the_same_redaction(capsys):
    """psycopg_pool, asyncio, uvicorn and httpx log through the stdlib, not structlog: their lines
    must be redacted (and rendered like evq's) rather than printed raw by Python's last resort."""
    import logging

    import structlog

    from evq.worker.logs import configure, register_secrets

    register_secrets([SECRET])
    root = logging.getLogger()
    handlers = list(root.handlers)
    configure("json", "info")
    try:
        logging.getLogger("psycopg.pool").warning(
            "error connecting in 'evq': bad dsn %s", f"postgresql://u:{SECRET}@h/d"
        )
        logging.getLogger("httpx").info("HTTP Request: noise below the threshold")
        err = capsys.readouterr().err
    finally:
        # The configuration is process-wide: later tests (capture_logs) expect structlog's defaults.
        structlog.reset_defaults()
        root.handlers[:] = handlers
    line = json.loads(err.strip().splitlines()[-1])
    assert line["logger"] == "psycopg.pool" and line["level"] == "warning" and "***" in line["event"]
    assert SECRET not in err and "noise below" not in err


def test_a_log_event_is_scrubbed_as_scrub_does_it_by_its_quick_path_or_the_long_one():
    register([SECRET])
    plain = {"event": "send_accepted", "step": 1, "latency_ms": 0.5, "ok": True, "none": None, "to_domain": "x.org"}
    events = [
        plain,
        {**plain, "to_domain": f"x {SECRET} y"},  # in a text
        {**plain, quote(SECRET, safe=""): 1},  # in a key, encoded
        {**plain, "nested": {"a": [SECRET, 2]}},  # not flat: the long way
        {**plain, "a": SECRET[:10], "b": SECRET[10:]},  # split across two texts: no secret in either
    ]
    for event in events:
        assert scrub_event(event) == scrub(event)
    assert scrub_event(plain) == plain
    assert SECRET not in json.dumps(scrub_event(events[1])) and "***" in scrub_event(events[1])["to_domain"]
