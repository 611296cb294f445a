"""What every command shares: the output option, settings, and one error boundary."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from evq.ops.cli.output import EXIT_INTERRUPTED, Output
from evq.ops.settings import Settings
from evq.ops.wiring import setup_logging
from evq.worker.errors import EvqError
from evq.worker.logs import get_logger

F = TypeVar("F", bound=Callable[..., Any])
log = get_logger("evq.cli")


def output_option(fn: F) -> F:
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="table for people; json for scripts and agents (one object on stdout).",
    )(fn)


class DocumentedOption(click.Option):
    """An option whose effective default comes from elsewhere (an EVQ_* setting):
    click's default stays None so the environment can win, and `evq schema` still
    tells the real default and variable."""

    def __init__(
        self,
        *args: Any,
        documented_default: Any = None,
        documented_envvar: str | None = None,
        **kwargs: Any,
    ):
        self.documented_default = documented_default
        self.documented_envvar = documented_envvar
        super().__init__(*args, **kwargs)


def database_option(fn: F) -> F:
    return click.option(
        "--database-url",
        cls=DocumentedOption,
        documented_envvar="EVQ_DATABASE_URL",
        metavar="URL",
        default=None,
        help="PostgreSQL URL [env: EVQ_DATABASE_URL; unset: the embedded server].",
    )(fn)


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
