"""Issue 18, the first hour: a worker whose every send fails the same way says so once, with the
cause and the setting to change; a working one says each accepted send at info."""

from __future__ import annotations

from dataclasses import replace

import structlog

from evq.worker.logs import merge_step
from evq.worker.outcomes import Accepted, Retryable
from evq.worker.runner import Worker
from evq.worker.streaks import WARN_AFTER, FailureStreaks
from tests.core.test_worker import SETTINGS, enqueue
from tests.storeview import step


class Refusing:
    """An SMTP provider where nothing listens: every attempt is the same provider fault."""

    name = "smtp"
    dedupe_window = None

    def __init__(self, fault: str | None = "connection_refused"):
        self.fault = fault
        self.calls = 0

    async def send(self, request):
        self.calls += 1
        return Retryable("ConnectionRefusedError at connect: [Errno 111] Connection refused", fault=self.fault)

    def fix_hint(self, cause: str) -> str | None:
        return "set EVQ_SMTP_HOST/EVQ_SMTP_PORT" if cause == "connection_refused" else None

    async def close(self) -> None:
        return None


def _run_logs():
    return structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars, merge_step])


async def test_sends_that_all_fail_the_same_way_are_said_once_with_the_setting_to_change(store):
    ids = await enqueue(store, 3)
    provider = Refusing(fault=None)  # an ordinary temporary failure: no circuit opens on it
    worker = Worker(store, {"smtp": provider}, replace(SETTINGS, max_attempts=2))
    with _run_logs() as logs:
        assert await worker.run(drain=True, install_signals=False) == 0
    assert provider.calls == 2 * len(ids)
    warnings = [e for e in logs if e["event"] == "sends_failing"]
    # Once per streak, at the WARN_AFTER-th failure in a row, not once per send.
    assert len(warnings) == 1 and warnings[0]["log_level"] == "warning", warnings
    assert warnings[0]["attempts"] == WARN_AFTER and warnings[0]["provider"] == "smtp"
    assert "Connection refused" in warnings[0]["message"]
    summary = worker.summary()
    assert summary["all_failed"] is True
    assert [(f["provider"], f["attempts"]) for f in summary["failing"]] == [("smtp", 2 * len(ids))]


async def test_a_provider_fault_is_said_at_its_first_failure_and_names_the_fix(store):
    await enqueue(store, 1)
    worker = Worker(store, {"smtp": Refusing()}, SETTINGS)
    with _run_logs() as logs:
        await worker.run(drain=True, install_signals=False)
    [warning] = [e for e in logs if e["event"] == "sends_failing"]
    assert warning["cause"] == "connection_refused" and warning["attempts"] == 1
    assert warning["hint"] == "set EVQ_SMTP_HOST/EVQ_SMTP_PORT" and warning["message"].endswith(warning["hint"])


async def test_an_accepted_send_is_one_info_line_with_its_domain_never_its_address_or_subject(store):
    [i] = await enqueue(store, 1)
    worker = Worker(store, {"smtp": _accepting()}, SETTINGS)
    with _run_logs() as logs:
        await worker.run(drain=True, install_signals=False)
    [line] = [e for e in logs if e["event"] == "send_accepted"]
    payload = (await step(store, i))["payload"]
    assert line["log_level"] == "info" and line["step"] == i and line["provider"] == "smtp"
    assert (
        line["provider_message_id"] == "queued-1" and line["to_domain"] == payload["to"][0]["email"].rsplit("@", 1)[1]
    )
    flat = repr(logs)
    assert payload["to"][0]["email"] not in flat and payload["subject"] not in flat
    assert not worker.summary()["all_failed"] and worker.summary()["failing"] == []


def _accepting():
    provider = Refusing()

    async def send(request):
        return Accepted("queued-1")

    provider.send = send  # type: ignore[method-assign]
    return provider


def test_an_accepted_send_ends_the_streak_and_a_new_cause_starts_another():
    streaks = FailureStreaks()
    fail = Retryable("451 busy")
    assert [streaks.observe("smtp", fail) for _ in range(WARN_AFTER - 1)] == [None] * (WARN_AFTER - 1)
    assert streaks.observe("smtp", Accepted("x")) is None and streaks.ongoing() == []
    other = Retryable("TLS", fault="tls_failed")
    warned = streaks.observe("smtp", other)
    assert warned is not None and warned.cause == "tls_failed"
    assert streaks.observe("smtp", other) is None  # said once for this streak
    assert not streaks.all_failed  # one attempt was accepted
