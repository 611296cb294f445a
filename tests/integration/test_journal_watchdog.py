"""The journal lookup's watchdog (adapters/smtp/journal.py) against a real trickling peer on
loopback: a byte every 0.2 s of a greeting line that never ends defeats imaplib's per-read
timeout in the greeting imaplib's constructor reads, in clear (imap://, before STARTTLS) or
after the TLS handshake (imaps://, a private CA's certificate). The lookup fails at its
timeout and its thread ends too, instead of reading forever.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from evq.adapters.smtp.config import JournalImap
from evq.adapters.smtp.journal import ImapJournal, imap_tls_context
from evq.adapters.smtp.witness import WitnessTags
from evq.worker.ports import LookupFailed
from tests.realservers.certs import make_private_ca


@pytest.fixture(params=["starttls", "ssl"])
def trickler(request, tmp_path: Path) -> Iterator[ImapJournal]:
    tls = request.param
    ca = make_private_ca(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(ca.server_cert, ca.server_key)
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle(raw: socket.socket) -> None:
        try:
            conn = server_tls.wrap_socket(raw, server_side=True) if tls == "ssl" else raw
            with conn:
                while not stop.wait(0.2):
                    conn.sendall(b"*")
        except OSError:
            raw.close()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    where = JournalImap(tls, "127.0.0.1", listener.getsockname()[1], "evq", "INBOX")
    try:
        yield ImapJournal(
            where,
            password="pw-secret-1",
            tags=WitnessTags(b"p" * 32),
            timeout=0.6,
            ssl_context=imap_tls_context(ca.ca_file),
        )
    finally:
        stop.set()
        listener.close()


async def test_a_trickling_server_cannot_keep_the_lookup_thread(trickler: ImapJournal) -> None:
    before = set(threading.enumerate())
    with pytest.raises(LookupFailed, match="no whole answer"):
        await trickler.lookup("key", "<evq.a@example.org>")
    [thread] = [t for t in threading.enumerate() if t not in before and t.name == "evq-journal-imap"] or [None]
    if thread is not None:
        # Not a timing claim: a generous bound, far beyond the trickle's reach of per-read timeouts.
        thread.join(10)
        assert not thread.is_alive(), "the lookup's thread still reads from the trickling server"
