"""Per-provider rate limits that hold across every worker on every host (issue 12).

A provider caps requests per second (Resend's default is 2/s; an SES account has a
send rate). A limit kept per process multiplies by the number of workers, so a
fleet turns it into a storm of 429s. Here the limit is a token bucket in one
PostgreSQL row per provider, refilled from the database clock (the one clock all
hosts share) and taken by one atomic statement before the claim: N workers on N
hosts together never claim more than the bucket allows.

The rules, pure so they are tested without I/O:

- ``EVQ_RATE_LIMIT`` names a rate per provider: ``http=2/s,smtp=100/min`` (units
  ``/s``, ``/min``, ``/h``), optionally a burst, the bucket's size: ``http=2/s:5``.
  The default burst is one second's worth of the rate, at least one token, so a
  ``/min`` limit does not arrive as a whole minute's sends in one second.
- A claim for a limited provider asks for at most its free slots; the claim's limit
  becomes what was granted. Tokens granted but not used (the claim found fewer rows)
  are given back, so an idle queue does not drain the bucket. Tokens of a claim that
  failed are not given back: the claim may have committed with its answer lost, and
  a token too few only slows sending, a token too many could break the limit.
- A provider that says we send too fast (``Retryable(throttled=True)``: an HTTP 429)
  pauses the whole provider until its ``Retry-After`` (1 s without one, at most an
  hour whatever it says): the pause is written to the same row, so every worker with
  a limit for that provider stops claiming for it until then. The step itself
  retries after the Retry-After too (worker/transitions.py).
- No limit configured: no statement at all (the hot path does not pay). A 429 still
  pauses the worker that saw it, in memory, and is written down for the others.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from evq.worker import metrics
from evq.worker.logs import get_logger
from evq.worker.ports import RateStore

log = get_logger("evq.ratelimit")

# A 429 without Retry-After still means "slower": one second, the finest unit providers quote.
DEFAULT_PAUSE = 1.0
# Whatever a provider (or something pretending to be it) answers, it cannot stop a provider
# for days, and a pause stays a number PostgreSQL's intervals can hold.
MAX_PAUSE = 3600.0
# Checks of a bucket a worker found empty or paused are spaced at least this far apart.
MIN_RECHECK = 0.01

_UNITS = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_ITEM = re.compile(
    r"^(?P<provider>[a-z][a-z0-9_-]*)=(?P<count>[0-9]+(?:\.[0-9]+)?)/(?P<unit>[a-z]+)(?::(?P<burst>[0-9]+))?$"
)


@dataclass(frozen=True, slots=True)
class RateLimit:
    provider: str
    per_second: float
    burst: int

    def __str__(self) -> str:
        return f"{self.provider}={self.per_second:g}/s:{self.burst}"


def rate_limits(value: str) -> tuple[RateLimit, ...]:
    """``http=2/s,smtp=100/min:10`` -> limits; a ValueError naming the bad part otherwise."""
    limits: dict[str, RateLimit] = {}
    for part in (p.strip().lower().replace(" ", "") for p in value.split(",")):
        if not part:
            continue
        m = _ITEM.match(part)
        if m is None or m["unit"] not in _UNITS:
            raise ValueError(
                f"{part!r} is not PROVIDER=COUNT/UNIT[:BURST] (UNIT one of s, min, h), e.g. http=2/s or smtp=100/min:10"
            )
        count = float(m["count"])
        per_second = count / _UNITS[m["unit"]]
        if not math.isfinite(per_second) or per_second <= 0 or count > 1e6:
            raise ValueError(f"{part!r}: the count must be above 0 and at most 1000000")
        burst = int(m["burst"]) if m["burst"] is not None else max(1, math.ceil(per_second))
        if not 1 <= burst <= 1_000_000:
            raise ValueError(f"{part!r}: the burst must be 1 to 1000000 requests")
        if m["provider"] in limits:
            raise ValueError(f"{m['provider']!r} is named twice")
        limits[m["provider"]] = RateLimit(m["provider"], per_second, burst)
    return tuple(limits.values())


def pause_seconds(retry_after: float | None) -> float:
    """How long a "too fast" answer pauses its provider."""
    if retry_after is None:
        return DEFAULT_PAUSE
    if not math.isfinite(retry_after):
        return MAX_PAUSE if retry_after > 0 else DEFAULT_PAUSE
    return min(MAX_PAUSE, max(0.0, retry_after))


ClaimFn = Callable[..., Awaitable[list[Any]]]


class RateGate:
    """The worker's side of the limits: asks the buckets before a claim, pauses on "too fast".

    What it learns (a pause, an empty bucket) it keeps until then on the monotonic clock,
    so a worker held back asks the database again only when the answer may have changed.
    """

    def __init__(
        self,
        store: RateStore,
        limits: Sequence[RateLimit],
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.store = store
        self.limits: Mapping[str, RateLimit] = {limit.provider: limit for limit in limits}
        self.clock = clock
        self._not_before: dict[str, float] = {}  # provider -> monotonic time to ask again
        self.held_back = False  # the last claim left rows for later because of a limit or a pause

    @property
    def active(self) -> bool:
        """False: the claim runs as if there were no gate (no statement, no filtering)."""
        return bool(self.limits) or bool(self._not_before)

    def wait_hint(self) -> float | None:
        """Seconds until a provider held back may be asked again (None: none is held back)."""
        if not self._not_before:
            return None
        return max(MIN_RECHECK, min(self._not_before.values()) - self.clock())

    def _blocked(self, provider: str, now: float) -> bool:
        until = self._not_before.get(provider)
        if until is None:
            return False
        if until <= now:
            del self._not_before[provider]
            return False
        return True

    def _hold(self, provider: str, seconds: float) -> None:
        self._not_before[provider] = max(self._not_before.get(provider, 0.0), self.clock() + max(MIN_RECHECK, seconds))

    async def claim(self, claim: ClaimFn, providers: Sequence[str], limit: int, **kwargs: Any) -> list[Any]:
        """Claim at most ``limit`` rows: limited providers first, each up to its grant;
        the rest of the slots go to providers without a limit, in one claim."""
        now = self.clock()
        self.held_back = False
        open_ = [p for p in providers if not self._blocked(p, now)]
        if len(open_) < len(providers):
            self.held_back = True
            for p in set(providers) - set(open_):
                metrics.labelled(metrics.RATE_LIMITED, p, "paused").inc()
        claimed: list[Any] = []
        for provider in (p for p in open_ if p in self.limits):
            left = limit - len(claimed)
            if left <= 0:
                break
            rate = self.limits[provider]
            grant = await self.store.rate_take(
                provider=provider, per_second=rate.per_second, burst=rate.burst, want=left
            )
            if grant.paused_for > 0:
                self._paused(provider, grant.paused_for, observed=False)
            if grant.granted < left:
                self.held_back = True
                metrics.labelled(metrics.RATE_LIMITED, provider, "paused" if grant.paused_for > 0 else "tokens").inc()
                if grant.paused_for <= 0:
                    self._hold(provider, grant.next_token_in)
            if grant.granted <= 0:
                continue
            rows = await claim(providers=[provider], limit=grant.granted, **kwargs)
            claimed.extend(rows)
            if len(rows) < grant.granted:
                # Unused tokens go back: an idle queue must not empty the bucket for everyone.
                await self.store.rate_refund(provider=provider, burst=rate.burst, tokens=grant.granted - len(rows))
        rest = [p for p in open_ if p not in self.limits]
        if rest and limit - len(claimed) > 0:
            claimed.extend(await claim(providers=rest, limit=limit - len(claimed), **kwargs))
        return claimed

    async def throttled(self, provider: str, retry_after: float | None) -> None:
        """The provider said we send too fast: pause it for every worker, this one at once."""
        seconds = pause_seconds(retry_after)
        if seconds <= 0:
            return
        metrics.labelled(metrics.PROVIDER_PAUSES, provider).inc()
        # This worker stops before the database hears of it: the write may fail or be slow.
        self._paused(provider, seconds, observed=True)
        lasts = await self.store.rate_pause(provider=provider, seconds=seconds)
        if lasts > seconds:
            self._paused(provider, lasts, observed=False)
        log.warning(
            "provider_paused",
            provider=provider,
            seconds=round(lasts, 3),
            note="the provider answered that we send too fast: no worker claims for it until then",
        )

    def _paused(self, provider: str, seconds: float, *, observed: bool) -> None:
        self._hold(provider, seconds)
        metrics.labelled(metrics.PROVIDER_PAUSED_UNTIL, provider).set(time.time() + seconds)
        if not observed:
            log.info("provider_pause_seen", provider=provider, seconds=round(seconds, 3))
