"""`evq mcp` at the JSON-RPC wire, as a real stdio subprocess, with lines no SDK client would send
(issue 13): a line that is not JSON gets a -32700 Parse error (id null), a JSON value that is not a
JSON-RPC message a -32600, and the server keeps answering afterwards; raw numbers JSON cannot carry
in a tool's arguments are a field error, not E_INTERNAL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from tests.acceptance.conftest import make_key
from tests.support import request, rows, spawn


class Wire:
    def __init__(self, db_url: str, key: str, **extra_env: str):
        env = {**os.environ, "EVQ_DATABASE_URL": db_url, "EVQ_API_KEY": key, "EVQ_LOG_FORMAT": "json", **extra_env}
        self.proc = spawn(
            [sys.executable, "-m", "tests.child", "mcp"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.err: list[str] = []
        self._drain = threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True)
        self._drain.start()

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        # A blocking read: the subprocess is killed by close() if it never answers (pytest's timeout).
        line = self.proc.stdout.readline()
        assert line, "".join(self.err)[-3000:]
        return json.loads(line)

    def call(self, rid: int, name: str, arguments_json: str) -> dict[str, Any]:
        # Raw text, not json.dumps: the arguments go on the wire exactly as the test wrote them.
        self.send(
            f'{{"jsonrpc": "2.0", "id": {rid:d}, "method": "tools/call", '
            f'"params": {{"name": "{name}", "arguments": {arguments_json}}}}}'
        )
        return self.answer()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        finally:
            self._drain.join(timeout=10)
            self.proc.stdout.close()
            self.proc.stderr.close()


def initialized(db_url: str, **extra_env: str) -> Wire:
    w = Wire(db_url, make_key(db_url, "bot", "agent", created_by=None), **extra_env)
    try:
        w.send(
            json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "1"},
                    },
                }
            )
        )
        assert w.answer()["id"] == 0
        w.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    except BaseException:
        w.close()
        raise
    return w


@pytest.fixture
def wire(db_url):
    w = initialized(db_url)
    try:
        yield w
    finally:
        w.close()


def test_a_line_that_is_not_json_gets_a_parse_error_and_the_server_keeps_going(wire):
    for bad in ("{not json", "\x00\x01", '{"jsonrpc": "2.0", "id": 5, "method": '):
        wire.send(bad)
        answer = wire.answer()
        assert answer["id"] is None and answer["error"]["code"] == -32700, answer
    wire.send("[1, 2, 3]")  # JSON, but no JSON-RPC message
    answer = wire.answer()
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    wire.send(json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}))
    answer = wire.answer()
    assert answer["id"] == 9 and "evq_steps_enqueue" in {t["name"] for t in answer["result"]["tools"]}


def test_a_request_whose_id_is_not_a_string_or_an_integer_gets_an_error_not_silence(wire):
    """The SDK read `"id": 1.5` (or 1e999, null, true) as a notification, dropped the id and
    answered nothing: a client waiting for its answer waited for ever. Each now gets -32600
    with id null, and the server keeps serving."""
    for rid in ("1.5", "1e999", "null", "true", "[1]"):
        wire.send(f'{{"jsonrpc": "2.0", "id": {rid}, "method": "tools/list"}}')
        answer = wire.answer()
        assert answer["id"] is None and answer["error"]["code"] == -32600, (rid, answer)
    wire.send(json.dumps({"jsonrpc": "2.0", "id": "s-1", "method": "tools/list"}))
    assert wire.answer()["id"] == "s-1"


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e999", "9" * 5000], ids=["nan", "inf", "1e999", "5000-digits"])
def test_raw_bad_numbers_in_tool_arguments_are_a_field_error(wire, db_url, number):
    data = request(run_id="wire", step_id="n")
    data["decision"] = {"rationale": {"score": "__N__"}}
    answer = wire.call(1, "evq_steps_enqueue", json.dumps(data).replace('"__N__"', number))
    if "error" in answer:
        # The SDK's own JSON parser refuses a 5,000-digit integer before evq sees the call: a
        # protocol error (id unknown, so null), still an answer and never E_INTERNAL.
        assert answer["error"]["code"] == -32700 and answer["id"] is None, answer
    else:
        assert answer["id"] == 1, answer
        body = answer["result"]["structuredContent"]
        assert body["status"] == "error" and body["error"]["code"] == "E_INVALID_ARG", body
        assert body["error"]["context"]["fields"][0]["field"] == "decision.rationale.score"
    assert rows(db_url, "SELECT count(*)::int AS n FROM steps_now") == [{"n": 0}]


def _peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def test_a_line_over_the_limit_is_skipped_with_an_error_and_never_held_in_memory(db_url):
    """Issue 13: the SDK read a line whole however long; a client (or anything piped in) that never
    sends a newline grew the server until it died. Lines are now bounded by EVQ_MAX_INPUT_BYTES."""
    wire = initialized(db_url, EVQ_MAX_INPUT_BYTES="65536")
    try:
        # A valid message, only too long: without a bound it is simply answered.
        padded = {"jsonrpc": "2.0", "id": 7, "method": "ping", "params": {"_meta": {"pad": "x" * (1 << 20)}}}
        wire.send(json.dumps(padded))
        answer = wire.answer()
        assert answer["id"] is None and answer["error"]["code"] == -32600, str(answer)[:300]
        assert "65536 bytes" in answer["error"]["message"] and "EVQ_MAX_INPUT_BYTES" in answer["error"]["message"]
        before = _peak_kib(wire.proc.pid)
        chunk = "y" * (1 << 20)
        for _ in range(64):  # 64 MiB with no newline, then one
            wire.proc.stdin.write(chunk)
        wire.send("")
        assert wire.answer()["error"]["code"] == -32600
        wire.send(json.dumps({"jsonrpc": "2.0", "id": 8, "method": "ping"}))
        assert wire.answer() == {"jsonrpc": "2.0", "id": 8, "result": {}}
        grown = _peak_kib(wire.proc.pid) - before
        assert grown < 16 * 1024, f"the server's peak memory grew by {grown} KiB reading a 64 MiB line"
    finally:
        wire.close()
