"""structlog setup: JSON when stderr is not a terminal, readable when it is.

Logs always go to stderr; stdout belongs to command output (the JSON contract).
A redaction processor replaces every registered secret (SMTP password, API keys,
the database password) wherever it appears in an event, so a secret that leaks
into an exception message still never reaches a log line (invariant 7).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, WrappedLogger

from evq.worker import secret_scrub as _scrub
from evq.worker.secret_scrub import REDACTED  # noqa: F401  (re-exported)


def register_secrets(values: Iterable[str | None]) -> None:
    _scrub.register(values)


def redact(value: Any) -> Any:
    return _scrub.scrub(value)


def _redact_processor(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    clean: EventDict = _scrub.scrub_event(event)  # scrub() of a mapping, as a dict
    return clean


# The identity of the step a task is sending, for every line logged in that task.
# One ContextVar set per send, merged into a line only when a line is logged:
# structlog's bind_contextvars costs one ContextVar per field on every send.
_STEP: ContextVar[Mapping[str, Any] | None] = ContextVar("evq_log_step", default=None)


def bind_step(fields: Mapping[str, Any]) -> None:
    """Bind ``fields`` to every line logged from now on in this task's context."""
    _STEP.set(fields)


def merge_step(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    """The processor for :func:`bind_step`; a field the call names itself wins."""
    fields = _STEP.get()
    if fields:
        if fields.keys().isdisjoint(event):  # the usual line: none of the fields named by the call
            event.update(fields)
        else:
            for key, value in fields.items():
                event.setdefault(key, value)
    return event


def _format_exc_info(logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
    """structlog's format_exc_info, called only for a line that has an exception to format (it
    does nothing to any other, at the price of a call and a pop on every line)."""
    if "exc_info" in event:
        formatted: EventDict = structlog.processors.format_exc_info(logger, name, event)
        return formatted
    return event


class _Stderr:
    """Whatever ``sys.stderr`` is at the moment of writing, not at configure time: a
    caller that swaps it later (a test's capture, a daemon redirecting its streams)
    must not leave evq writing to a stream that has since been closed."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _fallback(obj: Any) -> Any:
    """What JSON cannot say of a value, as structlog's JSONRenderer says it: its own
    ``__structlog__()``, else its repr."""
    structlog_form = getattr(obj, "__structlog__", None)
    return structlog_form() if callable(structlog_form) else repr(obj)


# One encoder for every line: json.dumps(..., default=...) builds a new encoder per call, and
# a worker logs a line per accepted send.
_ENCODER = json.JSONEncoder(default=_fallback)
# What _ENCODER.encode runs for a dict, called directly: encode() also builds a float formatter
# (unused by the C encoder) at every call. Absent from a Python built without the C accelerator.
_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)
_ESCAPE = json.encoder.encode_basestring_ascii


def _encode(event: Any, **_: Any) -> str:
    if _C_MAKE_ENCODER is None or type(event) is not dict:
        return _ENCODER.encode(event)
    # _ENCODER's settings (ASCII, ", " and ": ", NaN allowed, circular references refused with a
    # fresh record of them per line); the same text, character for character.
    return "".join(_C_MAKE_ENCODER({}, _fallback, _ESCAPE, None, ": ", ", ", False, False, True)(event, 0))


# The second a line's timestamp falls in, and its text: most lines of a busy worker share it.
_SECOND: tuple[int, str] = (-1, "")


def _timestamp(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    """structlog's TimeStamper(fmt="iso", utc=True), the same text (``2026-01-31T12:00:00.123456Z``;
    no fraction at a whole second, as isoformat() says it), with the date and time formatted once
    a second instead of a datetime made and formatted for every line."""
    global _SECOND
    whole, nanos = divmod(time.time_ns(), 1_000_000_000)
    second, text = _SECOND
    if whole != second:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _SECOND = (whole, text)
    micros = nanos // 1000
    event["timestamp"] = f"{text}.{micros:06d}Z" if micros else f"{text}Z"
    return event


def configure(fmt: str = "auto", level: str = "info") -> None:
    renderer: Any
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    if use_console:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(serializer=_encode)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            merge_step,
            structlog.processors.add_log_level,
            _timestamp,
            _format_exc_info,
            _redact_processor,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        # WriteLogger writes a line in one write (print() writes the text and its newline apart,
        # two system calls on an unbuffered stderr) and flushes, which _Stderr does; it is no
        # whole TextIO (no read, fileno...).
        logger_factory=structlog.WriteLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    _route_stdlib(renderer, level)


class _StdlibHandler(logging.StreamHandler[_Stderr]):
    """Marks the one handler evq puts on the root logger, so configuring again replaces it."""


def _route_stdlib(renderer: Any, level: str) -> None:
    """Libraries log through the stdlib (psycopg_pool's "error connecting", asyncio,
    uvicorn, httpx): their lines get the same redaction and format as evq's own, on
    stderr, instead of Python's last-resort handler printing them raw. Below WARNING
    they are noise (httpx logs every request at INFO), so they start at WARNING, or at
    the configured level when that is higher."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_logger_name,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _redact_processor, renderer],
    )
    handler = _StdlibHandler(_Stderr())
    handler.setFormatter(formatter)
    handler.setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)


def configure_from_env(env: Any = None) -> None:
    """Logs on stderr before the settings are read (or when they cannot be): a command
    that fails early must not print its log on stdout, which belongs to its output."""
    import os

    env = os.environ if env is None else env
    fmt = env.get("EVQ_LOG_FORMAT", "auto")
    level = env.get("EVQ_LOG_LEVEL", "info")
    configure(
        fmt if fmt in ("auto", "json", "console") else "auto",
        level if level in ("debug", "info", "warning", "error") else "info",
    )


def get_logger(name: str) -> FilteringBoundLogger:
    # structlog types its lazy proxy as Any; it binds to the wrapper class configure() sets,
    # a filtering bound logger.
    logger: FilteringBoundLogger = structlog.get_logger(name)
    return logger
