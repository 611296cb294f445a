"""The command line built from the command table (ops/app/commands.py): every click
option and argument, every command's help and every group's, so a flag cannot be
described one way here and another in `evq schema`, the HTTP API or the MCP tools.

    @from_table("steps.resolve", steps)
    @command
    def steps_resolve(out, step_id, verdict, ...): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from evq.ops.app.commands import CREDENTIAL, GROUPS, Command, Kind, Param, command
from evq.ops.cli.auth import credential_callback


def table_group(name: str) -> click.Group:
    return click.Group(name, help=GROUPS[name])


def from_table(path: str, group: click.Group | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """The click command for table entry ``path`` around a command body (added to ``group``)."""
    entry = command(path)

    def decorate(fn: Callable[..., Any]) -> click.Command:
        cmd = click.Command(
            path.split(".")[-1],
            callback=fn,
            params=[click_param(p, entry) for p in entry.params],
            help=help_text(entry, cli=True),
            short_help=entry.summary,
        )
        if group is not None:
            group.add_command(cmd)
        return cmd

    return decorate


def help_text(entry: Command, *, cli: bool = False) -> str:
    """The help with its examples; ``cli``: marked so click keeps their lines as they are."""
    if not entry.examples:
        return entry.help
    return entry.help + ("\n\n\b\n" if cli else "\n\n") + "\n".join(entry.examples)


def click_param(p: Param, entry: Command) -> click.Parameter:
    kind = _click_type(p)
    if p.kind is Kind.ARGUMENT:
        return click.Argument([p.dest], type=kind, required=p.required, nargs=-1 if p.repeatable else 1)
    options: dict[str, Any] = {
        "help": p.help or None,
        "metavar": p.metavar,
        "required": p.required,
        "show_default": p.show_default,
    }
    if p.kind is Kind.FLAG:
        return click.Option([*p.flags, p.dest], is_flag=True, **options)
    if p.dest == CREDENTIAL:
        assert entry.permission is not None, entry.path
        # click reads the variable itself; the callback registers the key as a secret at once.
        options.update(envvar=p.env, callback=credential_callback(entry.permission))
    elif p.env and not p.setting:
        # A setting's variable is the loader's to read; any other is click's.
        options.update(envvar=p.env)
    # A setting's default is the settings loader's (after its EVQ_* variable), so not click's.
    default = None if p.setting or p.repeatable else p.default
    return click.Option([*p.flags, p.dest], type=kind, multiple=p.repeatable, default=default, **options)


def _click_type(p: Param) -> click.ParamType:
    if p.enum:
        return click.Choice(p.enum)
    if p.type == "integer":
        return click.IntRange(p.minimum, p.maximum) if (p.minimum, p.maximum) != (None, None) else click.INT
    if p.type == "number":
        return click.FloatRange(p.minimum, p.maximum) if (p.minimum, p.maximum) != (None, None) else click.FLOAT
    return click.STRING
