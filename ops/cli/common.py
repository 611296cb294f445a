"""What every command shares: settings, and one error boundary."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from evq.ops import wiring
from evq.ops.cli.output import EXIT_INTERRUPTED, Output
from evq.ops.settings import Settings
from evq.ops.wiring import setup_logging
from evq.worker.errors import EvqError
from evq.worker.logs import get_logger

F = TypeVar("F", bound=Callable[..., Any])
log = get_logger("evq.cli")


def load_settings(**overrides: Any) -> Settings:
    settings = Settings.load(**overrides)
    setup_logging(settings)
    return settings


def command(fn: F) -> F:
    """Run a command body with an Output; turn every error into the contract's shape.

    The body receives ``out`` and returns nothing (it printed) or an exit code.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, output: str = "table", **kwargs: Any) -> None:
        out = Output(output)
        wiring.forget_database()  # this command's meta names the database it resolves, or none
        ctx = click.get_current_context()
        try:
            code = fn(out, *args, **kwargs)
        except EvqError as exc:
            ctx.exit(out.error(exc))
        except KeyboardInterrupt:
            ctx.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            log.exception("internal_error", command=ctx.command_path)
            ctx.exit(out.error(EvqError(f"internal error ({type(exc).__name__}); see the log on stderr")))
        ctx.exit(code or 0)

    return wrapper  # type: ignore[return-value]


def run(coro: Any) -> Any:
    return asyncio.run(coro)
