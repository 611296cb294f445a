"""`evq mcp`'s stdio transport: the SDK's, plus the JSON-RPC errors it does not send.

The SDK's stdio reader turns a line it cannot read into an exception on the session's
stream and answers nothing, so a client that sent a broken line waits forever. JSON-RPC
2.0 says such a line gets an error with ``id: null``: -32700 when the line is not JSON,
-32600 when it is JSON but not a JSON-RPC message. A relay between the reader and the
server answers those and passes every other message through unchanged.
"""

from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO

import anyio
import anyio.to_thread
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError

from evq.ops.app.boundedinput import SETTING, read_line
from evq.worker.logs import get_logger

log = get_logger("evq.mcp")

# What the bounded reader hands the SDK in place of an over-long line: not JSON, so the
# SDK passes its parse failure to the relay, which recognises it by this text.
_TOO_LONG = "\x00evq:line-too-long\n"
# In place of a request whose id is neither a string nor an integer (1.5, 1e999, null, true):
# the SDK would read it as a notification (its id dropped) and answer nothing, so the client
# would wait for ever; JSON-RPC says Invalid Request, id null.
_BAD_ID = "\x00evq:bad-request-id\n"


class BoundedLines:
    """stdin as the SDK's reader consumes it (``async for line in stdin``), one bounded line at a time.

    Passing it to ``stdio_server`` means the SDK does not divert fd 0 to the null device;
    nothing in evq reads stdin but this."""

    def __init__(self, stream: BinaryIO, limit: int):
        self.stream, self.limit = stream, limit

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        line, too_long = await anyio.to_thread.run_sync(read_line, self.stream, self.limit)
        if too_long:
            return _TOO_LONG
        if not line:
            raise StopAsyncIteration
        if _bad_id(line):
            return _BAD_ID
        return line.decode("utf-8", errors="replace")


def _bad_id(line: bytes) -> bool:
    """Whether ``line`` is a request (it names a method) with an id JSON-RPC and MCP do not allow."""
    if b'"id"' not in line:
        return False
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return False  # not JSON (or too deep): the SDK's parse error answers it
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return False
    rid = message["id"]
    return not (isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)))


def error_for(exc: Exception, limit: int) -> JSONRPCError:
    """The JSON-RPC error for a line the SDK could not read (pydantic's ValidationError)."""
    errors: list[dict[str, Any]] = []
    try:
        errors = list(exc.errors())  # type: ignore[attr-defined]
    except Exception:
        pass
    if any(e.get("input") == _BAD_ID for e in errors):
        return JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error=ErrorData(
                code=INVALID_REQUEST, message="Invalid Request: a request's id must be a string or an integer"
            ),
        )
    if any(e.get("input") == _TOO_LONG for e in errors):
        return JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error=ErrorData(
                code=INVALID_REQUEST,
                message=f"Invalid Request: a line longer than {limit} bytes ({SETTING}) was skipped",
            ),
        )
    not_json = any(e.get("type") == "json_invalid" for e in errors) or isinstance(
        exc, (json.JSONDecodeError, UnicodeError)
    )
    if not_json:
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error"))
    return JSONRPCError(
        jsonrpc="2.0",
        id=None,
        error=ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a JSON-RPC 2.0 message"),
    )


async def run_stdio(server: Any, *, max_line: int) -> None:
    """Run an ``MCPServer`` on stdin/stdout, answering unreadable lines."""
    lowlevel = server._lowlevel_server
    stdin: Any = BoundedLines(sys.stdin.buffer, max_line)
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        relay_writer, relay_reader = create_context_streams[SessionMessage | Exception](0)

        async def relay() -> None:
            async with relay_writer:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        answer = error_for(item, max_line)
                        log.warning("mcp_unreadable_line", code=answer.error.code, error_class=type(item).__name__)
                        await write_stream.send(SessionMessage(answer))
                        continue
                    await relay_writer.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await lowlevel.run(relay_reader, write_stream, lowlevel.create_initialization_options())
            tg.cancel_scope.cancel()
