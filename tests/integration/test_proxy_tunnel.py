"""The SES and HTTP adapters behind a forward proxy (HTTPS_PROXY, which httpx honours), a real
one on loopback: httpcore hands our trace hook to the proxy's ``CONNECT`` as well, and writing
that request sends nothing to the provider. A proxy that refuses the tunnel, or tunnels and
then cuts the TLS handshake, leaves the send retryable with nothing sent; once our own request
went through the tunnel and the answer is lost, it stays unknown (fail closed).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from evq.adapters.http import HttpProvider
from evq.adapters.ses import SesProvider
from evq.worker.outcomes import Retryable, Unknown
from tests.integration.test_ses_adapter import make_request
from tests.realservers.certs import make_private_ca
from tests.sesserver import ACCESS_KEY, REGION, SECRET_KEY
from tests.support import WIRE_KEYS


def _head(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class Proxy:
    """``refuse``: 407 to the CONNECT; ``cut``: 200, then closed; ``tunnel``: 200, then bytes
    piped both ways to ``target``. ``connects`` holds each CONNECT line it read."""

    def __init__(self, mode: str, target: tuple[str, int] | None = None):
        self.mode, self.target = mode, target
        self.connects: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            self.connects.append(_head(conn).split(b"\r\n")[0])
            if self.mode == "refuse":
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                return
            conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            if self.mode == "cut" or self.target is None:
                return
            with socket.create_connection(self.target) as up:

                def pipe(a: socket.socket, b: socket.socket) -> None:
                    try:
                        while chunk := a.recv(65536):
                            b.sendall(chunk)
                    except OSError:
                        pass
                    for s in (a, b):
                        try:
                            s.shutdown(socket.SHUT_RDWR)
                        except OSError:
                            pass

                back = threading.Thread(target=pipe, args=(up, conn), daemon=True)
                back.start()
                pipe(conn, up)
                back.join(10)

    def close(self) -> None:
        self._sock.close()


class Swallower:
    """A TLS server (a private CA's certificate) that reads a whole request and closes without a
    byte of answer: the lost reply after our request went through the tunnel."""

    def __init__(self, cert: str, key: str):
        self.requests: list[bytes] = []
        self._ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ctx.load_cert_chain(cert, key)
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._sock.accept()
            except OSError:
                return
            try:
                with self._ctx.wrap_socket(raw, server_side=True) as conn:
                    head = _head(conn)
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    body = head.split(b"\r\n\r\n", 1)[1]
                    while len(body) < length and (chunk := conn.recv(65536)):
                        body += chunk
                    self.requests.append(head)
            except (OSError, ssl.SSLError):
                raw.close()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def proxy_env(monkeypatch) -> Iterator[None]:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield


def _ses(url: str, **kw) -> SesProvider:
    return SesProvider(
        region=REGION, endpoint_url=url, timeout=3.0, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY, **kw
    )


def _http(url: str) -> HttpProvider:
    return HttpProvider(base_url=url, api_key="proxy-test-key-0123456789", timeout=3.0, wire_keys=WIRE_KEYS)


@pytest.mark.parametrize("mode", ["refuse", "cut"])
@pytest.mark.parametrize("adapter", ["ses", "http"])
async def test_a_proxy_that_refuses_or_cuts_the_tunnel_leaves_the_send_retryable(
    proxy_env, monkeypatch, mode, adapter
) -> None:
    proxy = Proxy(mode)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    # Nothing listens there: only the proxy's CONNECT is ever written.
    p = _ses("https://127.0.0.1:9") if adapter == "ses" else _http("https://127.0.0.1:9")
    try:
        outcome = await p.send(make_request())
    finally:
        await p.close()
        proxy.close()
    assert proxy.connects == [b"CONNECT 127.0.0.1:9 HTTP/1.1"]
    assert isinstance(outcome, Retryable), outcome
    assert outcome.response["sent"] is False and outcome.response["phase"] == "request"


@pytest.mark.parametrize("adapter", ["ses", "http"])
async def test_a_lost_answer_after_our_request_went_through_the_tunnel_stays_unknown(
    proxy_env, monkeypatch, tmp_path: Path, adapter
) -> None:
    ca = make_private_ca(tmp_path)
    server = Swallower(ca.server_cert, ca.server_key)
    proxy = Proxy("tunnel", ("127.0.0.1", server.port))
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("AWS_CA_BUNDLE", ca.ca_file)  # botocore's ca_bundle, which the SES adapter verifies with
    monkeypatch.setenv("SSL_CERT_FILE", ca.ca_file)  # httpx's, for the HTTP adapter
    url = f"https://127.0.0.1:{server.port}"
    p = _ses(url) if adapter == "ses" else _http(url)
    try:
        outcome = await p.send(make_request())
    finally:
        await p.close()
        proxy.close()
        server.close()
    assert proxy.connects == [f"CONNECT 127.0.0.1:{server.port} HTTP/1.1".encode()]
    [request] = server.requests
    assert request.startswith(b"POST ")
    assert isinstance(outcome, Unknown), outcome
    assert outcome.response["sent"] is True
