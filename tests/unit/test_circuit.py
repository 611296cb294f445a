"""The circuit breaker's rules and the retry budget (worker/circuit.py, worker/transitions.py), pure."""

from __future__ import annotations

import pytest

from evq.ops.settings import Settings
from evq.worker.backoff import Backoff
from evq.worker.circuit import CONSECUTIVE_FAILURES, FAULTS, CircuitBook, CircuitConfig, CircuitState, circuit_faults
from evq.worker.errors import ConfigError
from evq.worker.options import duration
from evq.worker.outcomes import Accepted, Rejected, Retryable, Unknown
from evq.worker.records import ClaimedStep
from evq.worker.states import Reason, Status
from evq.worker.transitions import decide
from tests.unit.test_transitions import step as claimed

REFUSED = Retryable("ConnectionRefusedError at connect", fault="connection_refused")
BUSY = Retryable("smtp 451 at rcpt")


def book(**kw) -> CircuitBook:
    return CircuitBook(CircuitConfig(**{"failures": 3, **kw}))


def test_a_provider_fault_opens_at_once_and_is_not_charged():
    b = book()
    v = b.observe("smtp", REFUSED)
    assert not v.charged and v.trip is not None and v.trip.reason == "connection_refused"
    assert b.state("smtp") is CircuitState.OPEN
    # Sends that were already out and fail too: not charged, no second opening.
    again = b.observe("smtp", BUSY)
    assert not again.charged and again.trip is None
    assert b.state("http") is CircuitState.CLOSED  # per provider


def test_consecutive_temporary_failures_open_it_and_an_answer_resets_the_count():
    b = book()
    assert b.observe("smtp", BUSY).charged and b.observe("smtp", BUSY).charged
    b.observe("smtp", Accepted("q1"))  # the provider works: the run starts over
    assert b.observe("smtp", BUSY).charged and b.observe("smtp", BUSY).charged
    v = b.observe("smtp", BUSY)
    assert not v.charged and v.trip.reason == CONSECUTIVE_FAILURES
    # A refusal of one message is an answer too: the provider is up.
    b2 = book()
    b2.observe("smtp", BUSY), b2.observe("smtp", BUSY)
    b2.observe("smtp", Rejected("550 no such user"))
    assert b2.observe("smtp", BUSY).charged


def test_what_says_nothing_about_the_provider_changes_nothing():
    b = book(failures=1)
    for outcome in (
        Retryable("429", throttled=True),
        Rejected("policy", before_send=True),
        Unknown("lost"),
        Retryable("stopped before the final '.'", response={"error_class": "LeaseTooShort"}),
    ):
        v = b.observe("smtp", outcome)
        assert v.charged and v.trip is None and not v.close, outcome
    assert b.state("smtp") is CircuitState.CLOSED


def test_a_fault_not_configured_is_an_ordinary_temporary_failure():
    b = book(faults=frozenset({"auth_failed"}), failures=0)
    assert b.observe("smtp", REFUSED).charged and b.state("smtp") is CircuitState.CLOSED
    assert not b.observe("smtp", Retryable("535", fault="auth_failed")).charged


def test_a_probe_closes_on_an_answer_and_reopens_on_anything_else():
    b = book()
    b.learn([("smtp", CircuitState.HALF_OPEN)])
    assert b.observe("smtp", Accepted("q"), probe=True).close and b.state("smtp") is CircuitState.CLOSED
    b.learn([("smtp", CircuitState.HALF_OPEN)])
    v = b.observe("smtp", BUSY, probe=True)
    assert v.trip is not None and not v.charged  # reopened with the next, longer wait
    b.learn([("smtp", CircuitState.HALF_OPEN)])
    assert b.observe("smtp", Unknown("no answer after the final '.'"), probe=True).trip.reason == "probe_inconclusive"
    # Any accepted send closes a circuit this worker believes open.
    b.learn([("smtp", CircuitState.OPEN)])
    assert b.observe("smtp", Accepted("q")).close
    b.learn([])  # what the database says: nothing open
    assert not b.any_held


def test_probe_waits_double_up_to_the_maximum():
    c = CircuitConfig(probe_base=10, probe_max=600)
    assert [c.probe_delay(n) for n in range(8)] == [10, 20, 40, 80, 160, 320, 600, 600]
    assert c.probe_delay(10_000) == 600


def test_settings():
    assert circuit_faults("all") == frozenset(FAULTS) and circuit_faults("none") == frozenset()
    assert circuit_faults("auth_failed, forbidden") == {"auth_failed", "forbidden"}
    with pytest.raises(ValueError, match="unknown fault"):
        circuit_faults("connection_refused,typo")
    assert duration("5d") == 432000 and duration("90") == 90 and duration("1.5h") == 5400
    for bad in ("", "5w", "nan", "inf"):
        with pytest.raises(ValueError):
            duration(bad)
    # EVQ_CIRCUIT_FAULTS and _FAILURES are constants now (docs/settings.md): a Python caller's to pass.
    s = Settings.load({"EVQ_RETRY_FOR": "12h"}, circuit_faults="auth_failed", circuit_failures=0)
    assert (
        s.retry_for == 43200
        and s.worker_config().circuit().faults == {"auth_failed"}
        and s.worker_config().circuit().failures == 0
    )
    assert Settings.load({}).retry_for == 5 * 86400 and Settings.load({}).max_attempts == 1000
    # The longest wait between probes follows the first (60 x): never shorter than it.
    assert Settings.load({"EVQ_CIRCUIT_PROBE_BASE": "60"}).circuit_probe_max == 3600
    with pytest.raises(ConfigError, match="EVQ_CIRCUIT_PROBE_MAX"):
        Settings.load({}, circuit_probe_base=60, circuit_probe_max=30)
    with pytest.raises(ConfigError, match="unknown fault everything"):
        Settings.load({}, circuit_faults="everything")


def step(attempt=1, uncharged=0, budget_age=0.0, max_attempts=None, maybe_delivered=False) -> ClaimedStep:
    return claimed(attempt, max_attempts, maybe_delivered, uncharged_attempts=uncharged, budget_age=budget_age)


def go(s, outcome, *, charged=True, retry_for=3600.0):
    return decide(
        s,
        outcome,
        default_max_attempts=3,
        backoff=Backoff(10, 100),
        dedupe_window_open=False,
        retry_for=retry_for,
        charged=charged,
    )


def test_the_retry_budget_decides_and_its_last_retry_is_at_its_end():
    t = go(step(budget_age=3595), BUSY)
    assert t.to_status is Status.RETRYABLE and t.retry_delay == pytest.approx(5)
    t = go(step(attempt=2, budget_age=3600), BUSY)
    assert (t.to_status, t.reason) == (Status.REJECTED, Reason.RETRY_BUDGET_EXHAUSTED)
    assert t.detail["retried_for_seconds"] == 3600
    # Possibly delivered before: never rejected, whatever ran out.
    t = go(step(attempt=2, budget_age=4000, maybe_delivered=True), BUSY)
    assert (t.to_status, t.reason) == (Status.UNKNOWN, Reason.RETRY_BUDGET_EXHAUSTED)


def test_uncharged_attempts_do_not_count_against_the_message():
    # Attempt 7, of which 5 hit a provider fault: 2 charged of 3, so one more is allowed.
    t = go(step(attempt=7, uncharged=5), BUSY)
    assert t.to_status is Status.RETRYABLE and t.charged
    t = go(step(attempt=8, uncharged=5), BUSY)
    assert (t.to_status, t.reason) == (Status.REJECTED, Reason.ATTEMPTS_EXHAUSTED) and "(5 not charged)" in t.detail[
        "attempts"
    ]
    # The attempt that hit the fault: not charged, retried without a backoff grown by the outage.
    t = go(step(attempt=30, uncharged=27), REFUSED, charged=False)
    assert t.to_status is Status.RETRYABLE and not t.charged and t.detail["charged"] is False
    assert t.retry_delay <= 20
