"""One deadline per adapter call, and no irreversible step once the lease is short
(invariant 9), against real servers on loopback that misbehave in time
(tests/slowpeer.py: a reply held back, or trickled a byte at a time so that no
per-read timeout ever fires)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace

import pytest

from evq.adapters.smtp import SmtpProvider
from evq.worker.outcomes import Accepted, Outcome, Retryable, Unknown
from tests.integration.test_smtp_adapter import make_request
from tests.slowpeer import SlowSmtp
from tests.support import WIRE_KEYS

# The per-read timeout is longer than the trickle's interval, so only an overall
# deadline can end these conversations.
READ_TIMEOUT = 2.0


def limited(request, *, deadline: float | None, send_by: float | None = None):
    now = time.monotonic()
    return replace(
        request,
        deadline=None if deadline is None else now + deadline,
        send_by=None if send_by is None else now + send_by,
    )


def smtp_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("evq-smtp")]


def wait_for(predicate, timeout: float = 20.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_trickled_final_reply_is_cut_at_the_deadline_as_unknown_and_the_next_send_works() -> None:
    with SlowSmtp(["trickle-final"], interval=0.1) as server:

        async def run():
            provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT, max_workers=1)
            try:
                first = await provider.send(
                    limited(make_request(message_id="<evq.slow@example.org>"), deadline=1.5, send_by=1.0)
                )
                freed = await asyncio.to_thread(wait_for, lambda: not smtp_threads())
                second = await provider.send(
                    limited(make_request(message_id="<evq.next@example.org>"), deadline=30, send_by=20)
                )
                return first, freed, second
            finally:
                await provider.close()

        first, freed, second = asyncio.run(run())
    # The server took the first message and never finished its answer: it may deliver it.
    assert isinstance(first, Unknown)
    assert first.response["phase"] == "final" and first.response["error_class"] == "DeadlineExceeded"
    assert freed, "the cut conversation's thread is still running"
    # The only slot was given back: the next send connects and is delivered.
    assert isinstance(second, Accepted)
    assert server.by_message_id() == {"<evq.slow@example.org>": 1, "<evq.next@example.org>": 1}


# A reply after the final "." trickled and never finished (no CRLF): smtplib read what had come
# when the watchdog shut the socket as a whole reply ("2", "2", "2"... was code 222, accepted).
UNFINISHED_FINAL_REPLIES = {
    "2 repeated": (b"2", True),
    "250 queued, no line end": (b"250 2.0.0 Ok: queued as X", False),
    "5 repeated": (b"5", True),
    "554 refused, no line end": (b"554 5.7.1 refused", False),
}


def send_through(server: SlowSmtp, request) -> Outcome:
    async def run():
        provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT, max_workers=1)
        try:
            return await provider.send(request)
        finally:
            await provider.close()

    return asyncio.run(run())


@pytest.mark.parametrize("trickle, repeat", UNFINISHED_FINAL_REPLIES.values(), ids=UNFINISHED_FINAL_REPLIES)
def test_a_final_reply_cut_mid_line_at_the_deadline_is_no_reply(trickle: bytes, repeat: bool) -> None:
    with SlowSmtp(["trickle-final"], interval=0.1, trickle=trickle, repeat=repeat) as server:
        outcome = send_through(server, limited(make_request(), deadline=1.5, send_by=1.0))
        assert wait_for(lambda: not smtp_threads())
        assert len(server.messages) == 1  # the server took the message: it may deliver it
    assert isinstance(outcome, Unknown), outcome
    r = outcome.response
    assert (r["phase"], r["code"], r["error_class"]) == ("final", None, "DeadlineExceeded")
    assert "evq cut the exchange" in outcome.reason and "IncompleteReply" in r["reply"]
    # What had come of the reply is kept, and only what came.
    assert r["partial_reply"] and trickle.decode().startswith(r["partial_reply"][:1])
    assert set(r["partial_reply"]) <= set(trickle.decode())


def test_a_final_reply_trickled_whole_before_the_deadline_is_the_answer() -> None:
    with SlowSmtp(["trickle-final"], interval=0.02, trickle=b"250 2.0.0 Ok: queued as X\r\n", repeat=False) as s:
        outcome = send_through(s, limited(make_request(), deadline=20, send_by=15))
        assert s.trickled.is_set()
    assert isinstance(outcome, Accepted), outcome
    assert outcome.provider_message_id == "X" and outcome.response["code"] == 250


def test_a_final_reply_the_server_ends_mid_line_is_no_reply() -> None:
    """Not the deadline: the server closes the connection after "250 2.0.0 Ok" without its CRLF."""
    with SlowSmtp(["trickle-final"], interval=0.02, trickle=b"250 2.0.0 Ok", repeat=False) as server:

        async def run():
            provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT)
            try:
                pending = asyncio.create_task(provider.send(limited(make_request(), deadline=30, send_by=20)))
                assert await asyncio.to_thread(server.trickled.wait, 20)
                server.stop()  # closes the connection, the reply's line still open
                return await pending
            finally:
                await provider.close()

        outcome = asyncio.run(run())
    assert isinstance(outcome, Unknown), outcome
    r = outcome.response
    assert (r["phase"], r["code"], r["error_class"]) == ("final", None, "IncompleteReply")
    assert r["partial_reply"] == "250 2.0.0 Ok"


def test_a_data_reply_cut_mid_line_at_the_deadline_is_retryable_and_nothing_is_sent() -> None:
    """Before the final ".": "3", "3", "3"... never finished is no reply (smtplib read code 333)."""
    with SlowSmtp(["trickle-data"], interval=0.1, trickle=b"3") as server:
        outcome = send_through(server, limited(make_request(), deadline=1.5, send_by=1.0))
        assert wait_for(lambda: not smtp_threads())
    assert isinstance(outcome, Retryable), outcome
    r = outcome.response
    assert (r["phase"], r["code"], r["error_class"]) == ("data", None, "DeadlineExceeded")
    assert "nothing was sent" in outcome.reason and r["partial_reply"].startswith("333")
    assert server.messages == [] and server.unfinished == 0


def test_a_trickled_reply_before_the_final_dot_is_cut_as_retryable_and_nothing_is_sent() -> None:
    with SlowSmtp(["trickle-data"], interval=0.1) as server:

        async def run():
            provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT)
            try:
                return await provider.send(limited(make_request(), deadline=1.5, send_by=1.0))
            finally:
                await provider.close()

        outcome = asyncio.run(run())
        assert wait_for(lambda: not smtp_threads())
    assert isinstance(outcome, Retryable)
    assert outcome.response["phase"] == "data" and outcome.response["error_class"] == "DeadlineExceeded"
    assert "nothing was sent" in outcome.reason
    assert server.messages == [] and server.unfinished == 0


def test_the_final_dot_is_not_written_once_the_send_by_limit_has_passed() -> None:
    """What a paused worker meets when it wakes: its server had answered 354 long ago,
    the send-by limit has passed on the monotonic clock. The body goes out (the last
    blocking step), then the check, and the final "." is never written."""
    with SlowSmtp(["hold-data"]) as server:

        async def run():
            provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT)
            try:
                pending = asyncio.create_task(provider.send(limited(make_request(), deadline=30, send_by=0.5)))
                assert await asyncio.to_thread(server.at_data.wait, 20)
                await asyncio.sleep(0.7)  # the send-by limit passes while the server holds its 354
                server.release()
                return await pending
            finally:
                await provider.close()

        outcome = asyncio.run(run())
        # The server saw the body but never its end: nothing to deliver.
        assert wait_for(lambda: server.unfinished == 1)
    assert isinstance(outcome, Retryable)
    assert outcome.response["error_class"] == "LeaseTooShort" and outcome.response["sent"] is False
    assert outcome.response["phase"] == "body"
    assert server.messages == []


def test_a_send_past_its_send_by_limit_does_not_even_connect() -> None:
    with SlowSmtp() as server:

        async def run():
            provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT)
            try:
                return await provider.send(limited(make_request(), deadline=5, send_by=-1))
            finally:
                await provider.close()

        outcome = asyncio.run(run())
    assert isinstance(outcome, Retryable) and outcome.response["error_class"] == "LeaseTooShort"
    assert server.connections == 0 and server.messages == []


def test_close_never_waits_for_a_wedged_conversation() -> None:
    """A send with no deadline of its own (the trickle defeats its per-read timeout)
    must not hold the adapter's close, which a worker's shutdown awaits."""
    with SlowSmtp(["trickle-final"], interval=0.1) as server:

        async def run():
            provider = SmtpProvider(host=server.host, port=server.port, timeout=READ_TIMEOUT)
            pending = asyncio.create_task(provider.send(make_request()))
            assert await asyncio.to_thread(wait_for, lambda: len(server.messages) == 1)
            started = time.monotonic()
            await provider.close(grace=0.2)
            closed_in = time.monotonic() - started
            return await asyncio.wait_for(pending, 10), closed_in

        outcome, closed_in = asyncio.run(run())
        assert wait_for(lambda: not smtp_threads())
    assert closed_in < 10  # today's close() waits for the trickle: forever
    assert isinstance(outcome, Unknown) and outcome.response["phase"] == "final"
    assert server.by_message_id() == {make_request().message_id: 1}


# -- HTTP ----------------------------------------------------------------------


def test_an_http_request_is_not_written_once_the_send_by_limit_has_passed() -> None:
    """Checked at httpcore's "send_request_headers.started", after connecting: the
    provider gets no byte of the request, and the client stays usable."""
    from evq.adapters.http import HttpProvider
    from evq.ops.dev.http import DevHttpServer
    from tests.integration.test_http_adapter import API_KEY
    from tests.integration.test_http_adapter import make_request as http_request

    with DevHttpServer(api_key=API_KEY) as server:

        async def run():
            provider = HttpProvider(
                base_url=server.url, api_key=API_KEY, timeout=2.0, dedupe_window=3600, wire_keys=WIRE_KEYS
            )
            try:
                warm = await provider.send(limited(http_request(step_id="warm"), deadline=30, send_by=20))
                late = await provider.send(limited(http_request(step_id="late"), deadline=30, send_by=-0.001))
                after = await provider.send(limited(http_request(step_id="after"), deadline=30, send_by=20))
                return warm, late, after
            finally:
                await provider.close()

        warm, late, after = asyncio.run(run())
        sent_ids = [r["idempotency_key"] for r in server.requests]
    assert isinstance(warm, Accepted) and isinstance(after, Accepted)
    assert isinstance(late, Retryable)
    assert late.response["error_class"] == "LeaseTooShort" and late.response["sent"] is False
    assert sent_ids == [WIRE_KEYS.key(7, "run-1:warm"), WIRE_KEYS.key(7, "run-1:after")]


def test_a_trickled_http_answer_is_cut_at_the_requests_deadline_as_ambiguous() -> None:
    """Per-read timeouts (20 s here) never fire on a byte every 0.1 s; today the adapter's
    own bound is three of them (60 s). The request's deadline (1.5 s) is what ends it; the
    request was written, so the answer is ambiguous."""
    from evq.adapters.http import HttpProvider
    from tests.integration.test_http_adapter import make_request as http_request
    from tests.slowpeer import SlowHttp

    with SlowHttp() as server:

        async def run():
            provider = HttpProvider(
                base_url=server.url, api_key="k-secret-0123456789", timeout=20.0, wire_keys=WIRE_KEYS
            )
            try:
                started = time.monotonic()
                outcome = await provider.send(limited(http_request(), deadline=1.5, send_by=1.0))
                return outcome, time.monotonic() - started
            finally:
                await provider.close()

        outcome, took = asyncio.run(run())
        assert server.requests == 1
    assert took < 20  # cut by the deadline, not by any timeout of the adapter's own
    assert isinstance(outcome, Unknown) and outcome.response["sent"] is True
    assert outcome.response["error_class"] == "TimeoutError"
