"""`evq mcp`'s stdio transport: the SDK's, plus the JSON-RPC errors it does not send.

The SDK's stdio reader turns a line it cannot read into an exception on the session's
stream and answers nothing, so a client that sent a broken line waits forever. JSON-RPC
2.0 says such a line gets an error with ``id: null``: -32700 when the line is not JSON,
-32600 when it is JSON but not a JSON-RPC message. A relay between the reader and the
server answers those and passes every other message through unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from mcp.server.stdio import stdio_server
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp_types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError

from worker.logs import get_logger

log = get_logger("evq.mcp")


def error_for(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error for a line the SDK could not read (pydantic's ValidationError)."""
    errors: list[dict[str, Any]] = []
    try:
        errors = list(exc.errors())  # type: ignore[attr-defined]
    except Exception:
        pass
    not_json = any(e.get("type") == "json_invalid" for e in errors) or isinstance(exc, (json.JSONDecodeError, UnicodeError))
    if not_json:
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message="Parse error"))
    return JSONRPCError(jsonrpc="2.0", id=None,
                        error=ErrorData(code=INVALID_REQUEST, message="Invalid Request: not a JSON-RPC 2.0 message"))


async def run_stdio(server: Any) -> None:
    """Run an ``MCPServer`` on stdin/stdout, answering unreadable lines."""
    lowlevel = server._lowlevel_server
    async with stdio_server() as (read_stream, write_stream):
        relay_writer, relay_reader = create_context_streams[SessionMessage | Exception](0)

        async def relay() -> None:
            async with relay_writer:
                async for item in read_stream:
                    if isinstance(item, Exception):
                        answer = error_for(item)
                        log.warning("mcp_unreadable_line", code=answer.error.code, error_class=type(item).__name__)
                        await write_stream.send(SessionMessage(answer))
                        continue
                    await relay_writer.send(item)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            await lowlevel.run(relay_reader, write_stream, lowlevel.create_initialization_options())
            tg.cancel_scope.cancel()
