"""A loopback TCP proxy a test can cut: the network partition between a worker and
PostgreSQL, without touching the server other processes use."""

from __future__ import annotations

import asyncio
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._partitioned = False

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(5)
        return self

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._partitioned:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        marked = [False]  # this connection carries the statement whose answer is withheld
        await asyncio.gather(
            self._pipe(reader, up_writer, lambda data: self._watch(data, marked)),
            self._pipe(up_reader, writer, lambda data: self._withhold(data, marked)),
            return_exceptions=True,
        )
        self._writers -= {writer, up_writer}

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, forward=None) -> None:
        try:
            while data := await reader.read(65536):
                if forward is not None and not forward(data):
                    continue
                writer.write(data)
                await writer.drain()
        finally:
            writer.transport.abort()

    def withhold_answer(self, marker: bytes, nth: int = 1) -> threading.Event:
        """Forward the ``nth`` query whose text holds ``marker`` to the server, but never its
        answer (nor anything after it on that connection): the statement runs and commits, the
        client waits. The event is set once the whole answer, through ReadyForQuery, is held back."""
        self._marker, self._nth, self._seen = marker, nth, 0
        self._held_back = bytearray()
        self.withheld = threading.Event()
        return self.withheld

    def _watch(self, data: bytes, marked: list[bool]) -> bool:
        marker = getattr(self, "_marker", None)
        if marker is not None and marker in data:
            self._seen += 1
            if self._seen == self._nth:
                marked[0] = True
        return True

    def _withhold(self, data: bytes, marked: list[bool]) -> bool:
        if not marked[0]:
            return True
        self._held_back += data
        # ReadyForQuery, idle: the statement's transaction has committed on the server.
        if self._held_back.endswith(b"Z\x00\x00\x00\x05I"):
            self.withheld.set()
        return False

    def partition(self) -> None:
        """Drop every live connection and refuse new ones until heal()."""

        def cut() -> None:
            self._partitioned = True
            for w in list(self._writers):
                w.transport.abort()

        self._loop.call_soon_threadsafe(cut)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_partitioned", False)

    def stop(self) -> None:
        async def close() -> None:
            for w in list(self._writers):
                w.transport.abort()
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
