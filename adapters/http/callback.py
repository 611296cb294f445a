"""The POST of a signed callback (worker/callbacks.py) to an API key's notify URL.

SSRF-safe by default: the host is resolved first and the POST is refused when any
address it resolves to is loopback, private, link-local, multicast, reserved or
unspecified (EVQ_HTTP_CALLBACK_ALLOW_PRIVATE=true allows them: tests, a receiver on
the same network); redirects are never followed (a public URL could redirect inward);
the whole request is bounded by EVQ_HTTP_CALLBACK_TIMEOUT and at most 64 KiB of the
answer is read. What remains: a name that resolves differently between the check and
the connection (DNS rebinding) is not pinned.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from evq.worker.callbacks import CallbackRefused

if TYPE_CHECKING:
    import httpx

MAX_ANSWER = 64 * 1024


class CallbackPoster:
    def __init__(self, *, timeout: float = 5.0, allow_private: bool = False):
        self.timeout = timeout
        self.allow_private = allow_private
        # Made at the first callback, not at start-up: most workers have no API key with a
        # notify URL, and the client's import and its TLS context (the CA bundle read and
        # parsed) were a large share of a worker's spawn to first claim.
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout),
                follow_redirects=False,
                trust_env=False,
                headers={"user-agent": "evq"},
            )
        return self._client

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CallbackRefused("not an http(s) URL")
        if not self.allow_private:
            await self._check_public(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        import httpx

        try:
            async with asyncio.timeout(self.timeout):
                async with self._http().stream("POST", url, content=body, headers=dict(headers)) as answer:
                    read = 0
                    async for chunk in answer.aiter_bytes():
                        read += len(chunk)
                        if read >= MAX_ANSWER:
                            break
                    return answer.status_code
        except httpx.TimeoutException:
            raise TimeoutError("no answer in time") from None
        except httpx.HTTPError as exc:
            # The error's text may quote the URL (which may carry the receiver's token): its class only.
            raise OSError(type(exc).__name__) from None

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
        if self._client is not None:
            await self._client.aclose()


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
