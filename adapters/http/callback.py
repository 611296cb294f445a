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
from urllib.parse import urlsplit

import httpx

from evq.worker.callbacks import CallbackRefused

MAX_ANSWER = 64 * 1024


class CallbackPoster:
    def __init__(self, *, timeout: float = 5.0, allow_private: bool = False):
        self.timeout = timeout
        self.allow_private = allow_private
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=False, headers={"user-agent": "evq"}
        )

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> int:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CallbackRefused("not an http(s) URL")
        if not self.allow_private:
            await self._check_public(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
        try:
            async with asyncio.timeout(self.timeout):
                async with self._client.stream("POST", url, content=body, headers=dict(headers)) as answer:
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
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.timeout):
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        for info in infos:
            address = ipaddress.ip_address(info[4][0])
            if not address.is_global or address.is_multicast:
                raise CallbackRefused(
                    f"{host} resolves to a non-public address ({address}); EVQ_HTTP_CALLBACK_ALLOW_PRIVATE allows it"
                )

    async def close(self) -> None:
        await self._client.aclose()
