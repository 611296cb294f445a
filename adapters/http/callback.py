"""The POST of a signed callback (worker/callbacks.py) to an API key's notify URL.

SSRF-safe by default: the host is resolved first and the POST is refused when any
address it resolves to is loopback, private, link-local, multicast, reserved or
unspecified (EVQ_HTTP_CALLBACK_ALLOW_PRIVATE=true allows them: tests, a receiver on
the same network); redirects are never followed (a public URL could redirect inward);
the whole request is bounded by EVQ_HTTP_CALLBACK_TIMEOUT and at most 64 KiB of the
answer is read. What remains: a name that resolves differently between the check and
the connection (DNS rebinding) is not pinned.

The standard library's http.client, in a thread: every worker posts callbacks, and a worker
that sends through SMTP alone needs no HTTP client library (`pip install evq` has none).
No proxy from the environment, no redirect followed (http.client follows none).
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import socket
import ssl
from collections.abc import Mapping
from urllib.parse import SplitResult, urlsplit

from evq.worker.callbacks import CallbackRefused

MAX_ANSWER = 64 * 1024


class CallbackPoster:
    def __init__(self, *, timeout: float = 5.0, allow_private: bool = False):
        self.timeout = timeout
        self.allow_private = allow_private
        # Made at the first https callback, not at start-up: most workers have no API key with
        # a notify URL, and reading and parsing the CA bundle was a real share of a worker's
        # spawn to first claim.
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CallbackRefused("not an http(s) URL")
        if not self.allow_private:
            await self._check_public(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        try:
            async with asyncio.timeout(self.timeout):
                return await asyncio.to_thread(self._post, parts, body, headers)
        except TimeoutError:
            raise TimeoutError("no answer in time") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # The error's text may quote the URL (which may carry the receiver's token): its class only.
            raise OSError(type(exc).__name__) from None

    def _post(self, parts: SplitResult, body: bytes, headers: Mapping[str, str]) -> int:
        """One POST, blocking (in a thread); every socket operation bounded by the timeout."""
        host, port = parts.hostname or "", parts.port
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=self._tls)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            conn.request("POST", path, body=body, headers={"user-agent": "evq", **headers})
            answer = conn.getresponse()
            answer.read(MAX_ANSWER)
            return answer.status
        finally:
            conn.close()

    async def _check_public(self, host: str, port: int) -> None:
        # Every address the name resolves to must be public (see public()).
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not public(address):
                raise CallbackRefused(
                    f"{host} resolves to a non-public address ({address}); EVQ_HTTP_CALLBACK_ALLOW_PRIVATE allows it"
                )

    async def close(self) -> None:
        """Nothing held between posts: each one opens and closes its own connection."""


# IPv6 ranges that carry an IPv4 address a gateway or the host may translate to (NAT64, 6to4,
# IPv4-compatible) or that are not routed publicly (site-local): is_global says True for
# some of them on Python 3.11, so they are judged by the IPv4 address inside, or refused.
_EMBEDS_V4 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96"))
_REFUSED_V6 = (
    ipaddress.ip_network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215)
    ipaddress.ip_network("2002::/16"),  # 6to4: the next 32 bits are an IPv4 address
    ipaddress.ip_network("fec0::/10"),  # site-local (deprecated, never public)
)


def public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a callback may be POSTed to ``address``: a global unicast address, judged by the
    IPv4 address it carries when it carries one (mapped, NAT64, IPv4-compatible)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return public(address.ipv4_mapped)
        if any(address in net for net in _EMBEDS_V4):
            return public(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if any(address in net for net in _REFUSED_V6):
            return False
    return address.is_global and not address.is_multicast
