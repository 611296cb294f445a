"""Waiting strategies, all from tenacity: retry delays for steps, reconnect delays
for the database, and jitter for periodic work."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tenacity import RetryCallState, Retrying, wait_exponential, wait_random
from tenacity.wait import wait_base

# Only the attempt number of the state reaches these strategies; the retrying object is
# the state's required owner, never run.
_OWNER = Retrying()


def exponential_jitter(initial: float, maximum: float, jitter: float) -> wait_base:
    """initial * 2**(n-1), capped, plus up to ``jitter`` seconds at random (tenacity's
    long-standing pieces, composed, so the behaviour does not shift between releases)."""
    return wait_exponential(multiplier=initial, max=maximum) + wait_random(0, jitter)


def _wait(strategy: wait_base, attempt: int) -> float:
    state = RetryCallState(retry_object=_OWNER, fn=None, args=(), kwargs={})
    state.attempt_number = max(1, attempt)
    return float(strategy(state))


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before a step's next attempt: exponential, with jitter, capped."""

    base: float = 5.0
    maximum: float = 900.0

    def delay(self, attempt: int) -> float:
        if self.base <= 0:
            return 0.0
        return min(self.maximum, _wait(exponential_jitter(self.base, self.maximum, self.base), attempt))


def reconnect_delay(failures: int, *, initial: float = 0.2, maximum: float = 10.0) -> float:
    """Delay before talking to the database again after ``failures`` failures in a row."""
    return _wait(exponential_jitter(initial, maximum, initial * 2), failures)


def jitter(seconds: float, fraction: float = 0.1) -> float:
    """Spread periodic work of many processes so they do not run in lockstep."""
    return seconds * (1 + random.uniform(-fraction, fraction))
