"""The rate-limit rules without I/O: EVQ_RATE_LIMIT's syntax, the pause length, and the gate's
order of claims (limited providers first, each up to its grant; unused tokens given back)."""

from __future__ import annotations

import math

import pytest

from evq.ops.settings import Settings
from evq.worker.errors import ConfigError
from evq.worker.ratelimit import DEFAULT_PAUSE, MAX_PAUSE, RateGate, RateLimit, pause_seconds, rate_limits
from evq.worker.records import Grant


def test_rates_per_second_minute_and_hour_with_a_default_burst_of_one_seconds_worth():
    assert rate_limits("http=2/s, smtp=100/min") == (RateLimit("http", 2.0, 2), RateLimit("smtp", 100 / 60, 2))
    assert rate_limits("smtp=14/s:30,null=3600/h") == (RateLimit("smtp", 14.0, 30), RateLimit("null", 1.0, 1))
    assert rate_limits("HTTP=0.5/s") == (RateLimit("http", 0.5, 1),)  # never a bucket of no token
    assert rate_limits("") == ()
    assert Settings.load({"EVQ_RATE_LIMIT": "http=2/s"}).rate_limit == (RateLimit("http", 2.0, 2),)
    assert Settings.load({}).rate_limit == ()


@pytest.mark.parametrize(
    "value, says",
    [
        ("http=2", "PROVIDER=COUNT/UNIT"),
        ("http=2/day", "PROVIDER=COUNT/UNIT"),
        ("http", "PROVIDER=COUNT/UNIT"),
        ("http=-1/s", "PROVIDER=COUNT/UNIT"),
        ("http=nan/s", "PROVIDER=COUNT/UNIT"),
        ("http=1e999/s", "PROVIDER=COUNT/UNIT"),
        ("http=0/s", "above 0"),
        ("http=99999999999999999999/s", "at most 1000000"),
        ("http=2/s:0", "burst must be 1"),
        ("http=2/s,http=5/s", "named twice"),
        ("mailgun=2/s", "unknown provider 'mailgun'"),
    ],
)
def test_a_bad_rate_limit_is_a_clear_error_naming_the_setting(value, says):
    with pytest.raises(ConfigError) as caught:
        Settings.load({"EVQ_RATE_LIMIT": value})
    assert "EVQ_RATE_LIMIT" in caught.value.message and says in caught.value.message


def test_a_pause_is_the_retry_after_within_bounds_whatever_the_provider_says():
    assert pause_seconds(None) == DEFAULT_PAUSE
    assert pause_seconds(3.0) == 3.0
    assert pause_seconds(0.0) == 0.0
    assert pause_seconds(10.0**21) == MAX_PAUSE  # "Retry-After: 1000000000000000000000"
    assert pause_seconds(math.inf) == MAX_PAUSE
    assert pause_seconds(math.nan) == DEFAULT_PAUSE
    assert pause_seconds(-5.0) == 0.0


class Buckets:
    """A fake RateStore: fixed tokens per provider, a list of what was asked."""

    def __init__(self, tokens: dict[str, int], paused: dict[str, float] | None = None):
        self.tokens = dict(tokens)
        self.paused = dict(paused or {})
        self.log: list[tuple[str, str, int]] = []

    async def rate_take(self, *, provider, per_second, burst, want, now=None):
        self.log.append(("take", provider, want))
        if self.paused.get(provider):
            return Grant(0, paused_for=self.paused[provider])
        granted = min(want, self.tokens[provider])
        self.tokens[provider] -= granted
        return Grant(granted, next_token_in=0.5 if granted < want else 0.0)

    async def rate_refund(self, *, provider, burst, tokens, now=None):
        self.log.append(("refund", provider, tokens))
        self.tokens[provider] += tokens

    async def rate_pause(self, *, provider, seconds, now=None):
        self.log.append(("pause", provider, int(seconds)))
        self.paused[provider] = seconds
        return seconds


class Rows:
    """A fake claim: ``available`` rows per provider, a list of the claims made."""

    def __init__(self, available: dict[str, int]):
        self.available = dict(available)
        self.claims: list[tuple[tuple[str, ...], int]] = []

    async def __call__(self, *, providers, limit, **kwargs):
        self.claims.append((tuple(providers), limit))
        out = []
        for p in providers:
            n = min(limit - len(out), self.available.get(p, 0))
            self.available[p] = self.available.get(p, 0) - n
            out += [p] * n
        return out


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_limited_providers_claim_first_up_to_their_grant_and_give_back_what_they_did_not_use():
    buckets = Buckets({"http": 3})
    claim = Rows({"http": 1, "smtp": 50})
    gate = RateGate(buckets, [RateLimit("http", 2, 3)])
    got = await gate.claim(claim, ["smtp", "http"], 10, owner="w")
    assert sorted(got) == ["http"] + ["smtp"] * 9
    assert claim.claims == [(("http",), 3), (("smtp",), 9)]
    assert buckets.log == [("take", "http", 10), ("refund", "http", 2)]  # 3 granted, 1 row found
    assert buckets.tokens["http"] == 2


async def test_an_empty_bucket_is_not_asked_again_before_its_next_token():
    clock = Clock()
    buckets = Buckets({"http": 0})
    claim = Rows({"http": 5})
    gate = RateGate(buckets, [RateLimit("http", 2, 2)], clock=clock)
    assert await gate.claim(claim, ["http"], 4) == [] and gate.held_back
    assert claim.claims == [] and gate.wait_hint() == pytest.approx(0.5)
    clock.now += 0.25
    assert await gate.claim(claim, ["http"], 4) == [] and buckets.log == [("take", "http", 4)]
    clock.now += 0.25
    buckets.tokens["http"] = 1
    assert await gate.claim(claim, ["http"], 4) == ["http"]
    assert buckets.log[-1] == ("take", "http", 4)


async def test_a_throttled_answer_pauses_the_provider_here_at_once_and_for_every_worker():
    clock = Clock()
    buckets = Buckets({"http": 10})
    gate = RateGate(buckets, [], clock=clock)  # no limit configured: inactive until a 429
    assert not gate.active
    await gate.throttled("http", 3.0)
    assert buckets.log == [("pause", "http", 3)] and gate.active
    claim = Rows({"http": 5, "smtp": 5})
    assert await gate.claim(claim, ["http", "smtp"], 4) == ["smtp"] * 4
    assert claim.claims == [(("smtp",), 4)]
    clock.now += 3.01
    assert await gate.claim(claim, ["http", "smtp"], 4) == ["http"] * 4 and not gate.active


async def test_a_pause_the_database_cannot_record_still_stops_this_worker():
    class Down(Buckets):
        async def rate_pause(self, **kwargs):
            raise ConnectionError("the database is away")

    gate = RateGate(Down({}), [], clock=Clock())
    with pytest.raises(ConnectionError):
        await gate.throttled("http", 5.0)
    claim = Rows({"http": 5})
    assert await gate.claim(claim, ["http"], 4) == [] and claim.claims == []


async def test_a_pause_another_worker_recorded_is_kept_until_it_ends():
    clock = Clock()
    buckets = Buckets({"http": 10}, paused={"http": 2.0})
    gate = RateGate(buckets, [RateLimit("http", 5, 5)], clock=clock)
    claim = Rows({"http": 5})
    assert await gate.claim(claim, ["http"], 4) == []
    assert gate.wait_hint() == pytest.approx(2.0)
    clock.now += 1
    assert await gate.claim(claim, ["http"], 4) == [] and len(buckets.log) == 1  # no second question
    buckets.paused.clear()
    clock.now += 1.01
    assert await gate.claim(claim, ["http"], 4) == ["http"] * 4
