"""A webhook receiver on loopback that checks Standard Webhooks signatures (issue 15's
signed callbacks): the fixture ``receiver``, registered through pytest_plugins."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver:
    """A webhook receiver: verifies each POST's signature with the secret it was given."""

    def __init__(self) -> None:
        self.secret = b""
        self.answers: list[int] = []  # status codes to answer with, in order (then 204)
        self.received: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                msg_id, stamp = self.headers["webhook-id"], self.headers["webhook-timestamp"]
                expected = base64.b64encode(
                    hmac.new(receiver.secret, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
                ).decode()
                signatures = [s.split(",", 1)[1] for s in self.headers["webhook-signature"].split(" ")]
                receiver.received.append(
                    {
                        "id": msg_id,
                        "valid": any(hmac.compare_digest(expected, s) for s in signatures),
                        "fresh": abs(time.time() - int(stamp)) < 300,
                        "body": json.loads(body),
                        "path": self.path,
                    }
                )
                self.send_response(receiver.answers.pop(0) if receiver.answers else 204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/evq?token=receiver-token"

    def use(self, secret_text: str) -> None:
        self.secret = base64.b64decode(secret_text.removeprefix("whsec_"))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()
