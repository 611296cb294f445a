"""Request input read with a bound (issue 13: `evq enqueue --file /dev/zero` read until
memory ran out).

Whatever a caller can point evq at (a file, stdin, a pipe that never ends, a device, one
line on `evq mcp`'s stdin) is read up to EVQ_MAX_INPUT_BYTES and refused beyond it, so a
mistake or a hostile input costs at most that much memory and is a clear E_INVALID_ARG
naming the limit, never a process the kernel kills. HTTP bodies have their own bound
(EVQ_SERVE_MAX_BODY, ops/web/protocol.py).
"""

from __future__ import annotations

import sys
from typing import BinaryIO

from evq.worker.errors import InvalidRequest

SETTING = "EVQ_MAX_INPUT_BYTES"
# A line longer than the limit is skipped in pieces this big, never held whole.
_SKIP_CHUNK = 64 * 1024


def too_large(what: str, limit: int) -> str:
    return f"{what} is larger than {limit} bytes, the most evq reads at once ({SETTING}); split it or raise the limit"


def read_limited(stream: BinaryIO, limit: int, *, what: str, field: str) -> bytes:
    """At most ``limit`` bytes of ``stream``; InvalidRequest if there is more."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise InvalidRequest([{"field": field, "message": too_large(what, limit)}])
    return data


def read_request_file(file: str, limit: int, *, field: str = "--file") -> str:
    """The text of ``file`` ('-' for stdin), bounded by ``limit`` bytes, as UTF-8."""
    what = "stdin" if file == "-" else file
    try:
        if file == "-":
            data = read_limited(sys.stdin.buffer, limit, what=what, field=field)
        else:
            with open(file, "rb") as stream:
                data = read_limited(stream, limit, what=what, field=field)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest([{"field": field, "message": f"cannot read {what}: {exc}"}]) from None


def read_line(stream: BinaryIO, limit: int) -> tuple[bytes, bool]:
    """One line of ``stream`` (b"" at its end) and whether it was over ``limit`` bytes.

    An over-long line is read to its end and dropped piece by piece, so the next line
    starts where it should and memory never holds more than ``limit`` bytes of it."""
    line = stream.readline(limit + 1)
    if len(line) <= limit or line.endswith(b"\n"):
        return line, False
    while line and not line.endswith(b"\n"):
        line = stream.readline(_SKIP_CHUNK)
    return b"", True
