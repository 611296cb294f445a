"""`python -m tests.child ARGS`: `evq ARGS` as a test's child process (and, through
:func:`constants`, as tests/inprocess.py runs it), where an ``EVQ_*`` variable may also name a
documented constant (docs/settings.md, "Constants"): a short timeout, a small limit, a failure
threshold of one.

evq itself reads no such variable: the constants are what nobody running evq turns, and a
Python caller passes them to ``Settings``. Tests that need one in a child set it here, as they
set it before it was a constant, and this entry point hands it to ``Settings.load`` as a
caller's value (a flag still wins)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evq.ops.settings import Settings


def given(env: Mapping[str, str]) -> dict[str, object]:
    """The constants ``env`` names, by field name, read as their variables were (a bad value is
    the same ConfigError naming the variable)."""
    from evq.ops.option_catalogue import CONSTANT_OPTIONS
    from evq.worker.options import parse

    return {o.name: parse(o, env[o.env], source=o.env) for o in CONSTANT_OPTIONS if env.get(o.env)}


@contextlib.contextmanager
def constants(env: Mapping[str, str]) -> Iterator[None]:
    """``Settings.load`` with the constants ``env`` names, for as long as the block runs."""
    from evq.ops.option_catalogue import CONSTANT_OPTIONS
    from evq.ops.settings import Settings

    if not any(env.get(o.env) for o in CONSTANT_OPTIONS):
        yield
        return
    load = Settings.__dict__["load"]

    def with_constants(cls: type[Settings], env_: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        # Read when the command loads its settings, so a bad value is its error (exit 2).
        values = given(env)
        return load.__func__(cls, env_, **{**values, **{k: v for k, v in overrides.items() if v is not None}})

    Settings.load = classmethod(with_constants)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Settings.load = load  # type: ignore[method-assign]


def main() -> None:
    from evq.ops.cli import main as cli

    sys.argv[0] = "evq"
    with constants(os.environ):
        cli()


if __name__ == "__main__":
    main()


def settings_from(env: Mapping[str, str]) -> Settings:
    """``Settings.load(env)`` as a test's child would read ``env``: its settings, and the documented
    constants it names (:func:`given`)."""
    from evq.ops.settings import Settings

    return Settings.load(env, **given(env))  # type: ignore[arg-type]
