"""Failed key checks, counted per client address: a client that presented
``failures`` wrong or revoked keys within ``window`` seconds is refused (HTTP 429,
Retry-After) until the oldest of them leaves the window, without its key being
looked up or hashed.

A key check is cheap (worker/keys.py), so this is not what keeps `evq serve`
responsive under a flood; it caps how many guesses an address gets, and how much of
the database's time a flood takes. IPv6 clients are counted by their /64 (one host
usually holds a whole /64, so counting single addresses would be no limit). Behind a
reverse proxy every client has the proxy's address: `evq serve` turns off uvicorn's
X-Forwarded-For handling (ops/web/slowclients.py), which would let a client name a new
address with every guess.

Memory is bounded: at most ``size`` addresses are remembered, the one idle longest
is forgotten first.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable


class FailureThrottle:
    def __init__(
        self, failures: int, window: float, *, size: int = 10_000, clock: Callable[[], float] = time.monotonic
    ):
        if failures < 1 or window <= 0:
            raise ValueError("failures must be at least 1 and window positive")
        self.failures = failures
        self.window = window
        self.size = size
        self._clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, address: str | None) -> int | None:
        """Whole seconds until ``address`` may present a key again; None: it may now."""
        times = self._recent(_client(address))
        if times is None or len(times) < self.failures:
            return None
        return max(1, math.ceil(times[0] + self.window - self._clock()))

    def failed(self, address: str | None) -> None:
        client = _client(address)
        times = self._recent(client)
        if times is None:
            times = self._seen[client] = deque(maxlen=self.failures)
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)
        times.append(self._clock())
        self._seen.move_to_end(client)

    def _recent(self, client: str) -> deque[float] | None:
        times = self._seen.get(client)
        if times is None:
            return None
        cutoff = self._clock() - self.window
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._seen[client]
            return None
        return times


def _client(address: str | None) -> str:
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or "?"  # a unix socket, or no peer address at all: one bucket
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
