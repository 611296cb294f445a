"""Failed key checks per client address (ops/web/throttle.py), on a clock the test moves."""

from __future__ import annotations

from evq.ops.web.throttle import FailureThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_refused_after_its_failures_until_the_oldest_leaves_the_window():
    clock = Clock()
    throttle = FailureThrottle(3, 60, clock=clock)
    for _ in range(3):
        assert throttle.retry_after("192.0.2.1") is None
        throttle.failed("192.0.2.1")
        clock.now += 10
    assert throttle.retry_after("192.0.2.1") == 30  # the first failure leaves the window in 30 s
    assert throttle.retry_after("192.0.2.2") is None  # another address is not affected
    clock.now += 30
    assert throttle.retry_after("192.0.2.1") is None  # two failures left in the window


def test_ipv6_clients_count_by_their_64_and_mapped_ipv4_as_ipv4():
    throttle = FailureThrottle(2, 60, clock=Clock())
    throttle.failed("2001:db8:1:2::1")
    throttle.failed("2001:db8:1:2:ffff::9")  # the same /64: one host, many addresses
    assert throttle.retry_after("2001:db8:1:2::42") is not None
    assert throttle.retry_after("2001:db8:1:3::1") is None
    throttle.failed("::ffff:192.0.2.7")
    throttle.failed("192.0.2.7")
    assert throttle.retry_after("192.0.2.7") is not None


def test_memory_is_bounded_forgetting_the_address_idle_longest():
    throttle = FailureThrottle(1, 60, size=2, clock=Clock())
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3"):
        throttle.failed(address)
    assert throttle.retry_after("192.0.2.1") is None
    assert throttle.retry_after("192.0.2.2") is not None and throttle.retry_after("192.0.2.3") is not None
