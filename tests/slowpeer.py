"""Peers that misbehave in time: a real SMTP server on loopback (plain sockets, one
thread per connection) that can hold its reply to DATA until told, or trickle a
reply a byte at a time so that no per-read timeout ever fires.

Each connection takes the next mode from ``modes`` (then ``default``):

* ``normal``: answers everything at once; 250 after the final ".".
* ``hold-data``: on DATA, sets ``at_data`` and answers 354 only after ``release()``.
* ``trickle-data``: answers DATA a byte at a time (``trickle``), forever (before the final ".").
* ``trickle-final``: takes the message, then answers it a byte at a time: ``trickle``
  (default: continuation lines, forever, as ``repeat``), then, unless repeated, goes on
  talking (a whole reply: the session continues; one without its CRLF: the client's wait).

``messages`` holds every message whose final "." arrived (what the server would
deliver); ``unfinished`` counts conversations that sent body text but no final ".".
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterable
from typing import Any, Self

_MESSAGE_ID = re.compile(rb"^Message-ID:\s*(\S+)", re.I | re.M)


class LoopbackPeer:
    """A TCP server on a loopback port with a thread per connection, started and stopped as a
    context manager; :meth:`_accepted` (a subclass's) takes each connection. Stopping shuts
    down the listener and every socket it was given (:attr:`_socks`), which wakes accept() and
    every recv, and joins the threads: each closes its own sockets."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()[:2]

    def __enter__(self) -> Self:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        for sock in [self._listener, *self._socks]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(10)
        self._listener.close()

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._accepted(conn)

    def _accepted(self, conn: socket.socket) -> None:
        raise NotImplementedError


class SlowSmtp(LoopbackPeer):
    def __init__(
        self,
        modes: Iterable[str] = (),
        *,
        default: str = "normal",
        interval: float = 0.2,
        trickle: bytes = b"250-still working\r\n",
        repeat: bool = True,
    ):
        super().__init__()
        self.trickle, self.repeat = trickle, repeat
        self.trickled = threading.Event()  # a trickle that is not repeated was all sent
        self.modes = list(modes)
        self.default = default
        self.interval = interval
        self.messages: list[dict[str, Any]] = []
        self.unfinished = 0
        self.connections = 0
        self.at_data = threading.Event()
        self._release = threading.Event()

    def release(self) -> None:
        self._release.set()

    def by_message_id(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.messages:
            counts[m["message_id"]] = counts.get(m["message_id"], 0) + 1
        return counts

    def stop(self) -> None:
        self._release.set()  # a held DATA answers, so its thread can end
        super().stop()

    def _accepted(self, conn: socket.socket) -> None:
        with self._lock:
            self._socks.append(conn)
            mode = self.modes.pop(0) if self.modes else self.default
            self.connections += 1
        self._spawn(self._serve, conn, mode)

    def _serve(self, conn: socket.socket, mode: str) -> None:
        try:
            with conn, conn.makefile("rb") as lines:
                self._talk(conn, lines, mode)
        except OSError:
            pass

    def _trickle(self, conn: socket.socket, text: bytes = b"250-still working\r\n", *, repeat: bool = True) -> bool:
        """``text`` one byte at a time, again and again while ``repeat``, until the client goes
        or the test ends: every read the client makes gets a byte well within any per-read
        timeout. True: all of it was sent once and the session goes on."""
        while not self._stopping.wait(self.interval):
            for byte in text:
                conn.sendall(bytes([byte]))
                if self._stopping.wait(self.interval):
                    return False
            if not repeat:
                self.trickled.set()
                return True
        return False

    def _talk(self, conn: socket.socket, lines: Any, mode: str) -> None:
        conn.sendall(b"220 slowpeer.evq.test ESMTP\r\n")
        while True:
            line = lines.readline()
            if not line:
                return
            verb = line.split(b" ", 1)[0].strip().upper()
            if verb in (b"EHLO", b"HELO"):
                conn.sendall(b"250 slowpeer.evq.test\r\n")
            elif verb in (b"MAIL", b"RCPT", b"RSET", b"NOOP"):
                conn.sendall(b"250 ok\r\n")
            elif verb == b"QUIT":
                conn.sendall(b"221 bye\r\n")
                return
            elif verb == b"DATA":
                if mode == "trickle-data":
                    self._trickle(conn, self.trickle)
                    return
                if mode == "hold-data":
                    self.at_data.set()
                    self._release.wait()
                    if self._stopping.is_set():
                        return
                conn.sendall(b"354 go ahead\r\n")
                body = bytearray()
                while True:
                    chunk = lines.readline()
                    if not chunk:
                        with self._lock:
                            self.unfinished += bool(body)
                        return
                    if chunk == b".\r\n":
                        break
                    body += chunk
                match = _MESSAGE_ID.search(bytes(body))
                with self._lock:
                    self.messages.append(
                        {"data": bytes(body), "message_id": match.group(1).decode() if match else None}
                    )
                if mode == "trickle-final":
                    if self._trickle(conn, self.trickle, repeat=self.repeat):
                        continue
                    return
                conn.sendall(f"250 2.0.0 Ok: queued as Q{len(self.messages)}\r\n".encode())
            else:
                conn.sendall(b"502 unknown command\r\n")


class SlowHttp(LoopbackPeer):
    """An HTTP server on loopback that reads each whole request, counts it, then answers
    a byte at a time, forever (a status line, then header lines that never end)."""

    def __init__(self, *, interval: float = 0.1):
        super().__init__()
        self.interval = interval
        self.requests = 0
        self.url = f"http://{self.host}:{self.port}"

    def _accepted(self, conn: socket.socket) -> None:
        with self._lock:
            self._socks.append(conn)
        self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rb") as reader:
                length = 0
                while True:
                    line = reader.readline()
                    if not line:
                        return
                    if line in (b"\r\n", b"\n"):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                reader.read(length)
                with self._lock:
                    self.requests += 1
                answer = b"HTTP/1.1 200 OK\r\n" + b"X-Still-Working: yes\r\n" * 10_000
                for byte in answer:
                    if self._stopping.wait(self.interval):
                        return
                    conn.sendall(bytes([byte]))
        except OSError:
            pass
