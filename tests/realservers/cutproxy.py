"""A loopback TCP proxy in front of a real SMTP server that loses the answer to the final ".".

Each connection takes the next mode from ``modes`` (then ``pass``):

* ``pass``: forwards both ways, untouched.
* ``lose-reply``: forwards the whole message, final "." included, to the server; the
  server's reply to it (its 250 and queue id) is kept in ``withheld`` and never reaches
  the client, whose connection is then reset. The server has queued the message; the
  client cannot know (the lost answer of docs/design.md, "Purpose and the hard case").
* ``lose-dot``: forwards everything but the final ".", then resets both sides: the server
  discards the unfinished message, the client is left as unsure as with ``lose-reply``.

Plain SMTP only (it reads the conversation to find the end of DATA).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterable

from tests.slowpeer import LoopbackPeer

_END = b"\r\n.\r\n"


def _reset(sock: socket.socket) -> None:
    """Break the connection (SO_LINGER 0: a RST once closed). The shutdown comes first: it
    wakes the other pump's recv on this socket, which a close from this thread would not."""
    for call in (
        lambda: sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)),
        lambda: sock.shutdown(socket.SHUT_RDWR),
        sock.close,
    ):
        try:
            call()
        except OSError:
            pass


class CutProxy(LoopbackPeer):
    def __init__(self, target_port: int, modes: Iterable[str] = (), target_host: str = "127.0.0.1"):
        super().__init__()
        self.target = (target_host, target_port)
        self.modes = list(modes)
        self.withheld: list[bytes] = []  # the server replies the client never got
        self.cut = threading.Event()  # set once a connection was cut as its mode says

    def _accepted(self, client: socket.socket) -> None:
        with self._lock:
            mode = self.modes.pop(0) if self.modes else "pass"
        try:
            server = socket.create_connection(self.target, timeout=10)
            server.settimeout(None)
        except OSError:
            _reset(client)
            return
        with self._lock:
            self._socks += [client, server]
        _Link(self, client, server, mode).start()


class _Link:
    """One proxied connection: two pumps and the little state that finds the final "."."""

    def __init__(self, proxy: CutProxy, client: socket.socket, server: socket.socket, mode: str):
        self.proxy, self.client, self.server, self.mode = proxy, client, server, mode
        self.in_data = False  # the server said 354: client bytes are message text until the final "."
        self.tail = b""  # the last client bytes of the message, to see the final "." across reads
        self.dot_sent = threading.Event()
        self.done = threading.Event()

    def start(self) -> None:
        self.proxy._spawn(self._upstream)
        self.proxy._spawn(self._downstream)

    def _finish(self) -> None:
        if not self.done.is_set():
            self.done.set()
            _reset(self.client)
            _reset(self.server)

    def _upstream(self) -> None:
        try:
            while data := self.client.recv(65536):
                if self.mode != "pass" and self.in_data:
                    seen = self.tail + data
                    if seen.endswith(_END):
                        if self.mode == "lose-dot":
                            keep = len(data) - 3  # ".\r\n"
                            if keep > 0:
                                self.server.sendall(data[:keep])
                            self.proxy.cut.set()
                            self._finish()
                            return
                        self.dot_sent.set()  # before the "." leaves: what comes back answers it
                        self.in_data = False
                    self.tail = seen[-len(_END) :]
                self.server.sendall(data)
        except OSError:
            pass
        finally:
            if self.mode == "pass" or not self.dot_sent.is_set():
                self._finish()

    def _downstream(self) -> None:
        try:
            while data := self.server.recv(65536):
                if self.dot_sent.is_set():
                    # The server's answer to the final ".": kept, never forwarded; the client's
                    # connection breaks instead.
                    self.proxy.withheld.append(data)
                    self.proxy.cut.set()
                    self._finish()
                    return
                if self.mode != "pass" and data.startswith(b"354"):
                    self.in_data = True
                    self.tail = b"\r\n"  # a "." on the first line of an empty body ends it too
                self.client.sendall(data)
        except OSError:
            pass
        finally:
            self._finish()
