"""Real peers for the SES adapter's tests, all on loopback:

* :class:`MotoSes`: moto, the widely used AWS emulator, in server mode
  (``ThreadedMotoServer``: real HTTP on a loopback port), with the sender identity
  verified. ``messages()`` is what moto's SES backend stored (``/moto-api/data.json``);
  ``sends()`` is every SendEmail request moto received, from moto's own request recorder
  (``/moto-api/recorder/``): moto's SES backend keeps no tags, its recorder keeps the body.
* :class:`SesErrorPeer`: a tiny HTTP server answering SendEmail with SES's documented
  error answers (status, ``x-amzn-ErrorType``, JSON ``{"message"}``) for the cases moto
  cannot produce (throttling, a suspended account), or a gateway's HTML 502.
* :class:`LostReplyProxy`: a TCP proxy in front of moto that forwards the whole request,
  reads moto's whole answer (so moto has really taken the message) and closes the client's
  connection without a byte of it: the lost reply.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import socket
import struct
import tempfile
import threading
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# moto's recorder writes to this file, read when moto is first imported: one per process
# (pytest-xdist runs several), so two processes' recordings never mix.
if "MOTO_RECORDER_FILEPATH" not in os.environ:
    _RECORDING = os.path.join(tempfile.gettempdir(), f"evq-moto-{os.getpid()}.jsonl")
    os.environ["MOTO_RECORDER_FILEPATH"] = _RECORDING
    atexit.register(lambda: os.path.exists(_RECORDING) and os.remove(_RECORDING))

# botocore's credential and region chain would ask the EC2 instance metadata service, an
# address off this machine: never from a test, nor from the workers it starts.
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"

from moto.server import ThreadedMotoServer

from tests.slowpeer import LoopbackPeer

REGION = "eu-west-1"
ACCESS_KEY = "AKIAEVQTESTKEY000001"
SECRET_KEY = "evq-test-secret-access-key-do-not-log"
SENDER = "agent@example.org"
SEND_PATH = "/v2/email/outbound-emails"


class MotoSes:
    def __init__(self, *, sender: str = SENDER):
        self.sender = sender
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)

    def __enter__(self) -> MotoSes:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"
        # moto keeps one state per process: start from nothing, record from here on.
        self._post("/moto-api/reset")
        self._post("/moto-api/recorder/reset-recording")
        self._post("/moto-api/recorder/start-recording")
        client = self.client()
        client.create_email_identity(EmailIdentity=self.sender)
        verified = {i["IdentityName"]: i for i in client.list_email_identities()["EmailIdentities"]}
        assert verified[self.sender]["VerificationStatus"] == "SUCCESS", verified
        client.close()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._post("/moto-api/recorder/stop-recording")
        finally:
            self._server.stop()

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "sesv2",
            region_name=REGION,
            endpoint_url=self.url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def _post(self, path: str) -> bytes:
        with urllib.request.urlopen(urllib.request.Request(self.url + path, method="POST", data=b"")) as answer:
            return answer.read()

    def _get(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path) as answer:
            return answer.read()

    def messages(self) -> list[dict[str, Any]]:
        """The raw messages moto's SES backend took: ``{id, source, destinations, raw_data}``."""
        data = json.loads(self._get("/moto-api/data.json"))
        return list(data.get("ses", {}).get("RawMessage", []))

    def sends(self) -> list[dict[str, Any]]:
        """The body of every SendEmail request moto received, as JSON."""
        out = []
        for line in self._get("/moto-api/recorder/download-recording").decode().splitlines():
            entry = json.loads(line)
            if entry.get("method") != "POST" or not entry["url"].endswith(SEND_PATH):
                continue
            body = entry.get("body") or ""
            raw = base64.b64decode(body) if entry.get("body_encoded") else body.encode()
            out.append(json.loads(raw))
        return out


class SesErrorPeer:
    """Answers every SendEmail with the next queued answer (then ``default``), counting requests.

    An answer is ``(status, error_type, message)``: SES's REST-JSON error, or ``(502, None,
    None)``: a gateway's HTML page without SES's error."""

    def __init__(self, answers: Iterable[tuple[int, str | None, str | None]] = (), *, default=None):
        self.answers = list(answers)
        self.default = default or (429, "TooManyRequestsException", "Too many requests")
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with peer._lock:
                    peer.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    status, error_type, message = peer.answers.pop(0) if peer.answers else peer.default
                if error_type is None:
                    payload = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html")
                else:
                    payload = json.dumps({"message": message}).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("x-amzn-ErrorType", f"{error_type}:http://internal.amazon.com/coral/")
                    self.send_header("x-amzn-RequestId", f"req-{len(peer.requests)}")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> SesErrorPeer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class LostReplyProxy(LoopbackPeer):
    """Forwards each HTTP request to ``target`` and drops the answer: the client's connection
    is closed once moto has answered, without a byte of that answer. ``forwarded`` counts the
    requests that reached moto; ``answers`` keeps the answers the client never saw."""

    def __init__(self, target_host: str, target_port: int):
        super().__init__()
        self.target = (target_host, target_port)
        self.forwarded = 0
        self.answers: list[bytes] = []
        self.url = f"http://127.0.0.1:{self.port}"

    def _accepted(self, conn: socket.socket) -> None:
        self._spawn(self._relay, conn)

    def _relay(self, conn: socket.socket) -> None:
        with conn:
            request = _read_http(conn)
            if request is None:
                return
            with socket.create_connection(self.target, timeout=10) as upstream:
                upstream.sendall(request)
                answer = _read_http(upstream)
            with self._lock:
                self.forwarded += 1
                self.answers.append(answer or b"")
            # The answer is lost: a reset, as a load balancer's idle cut or a crash gives.
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _read_http(sock: socket.socket) -> bytes | None:
    """One whole HTTP/1.1 message (headers and a Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data or None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest
