"""The command line built from the command table (ops/app/commands.py): every click
option and argument, every command's help and every group's, so a flag cannot be
described one way here and another in `evq schema`, the HTTP API or the MCP tools.

    @from_table("steps.resolve", steps)
    @command
    def steps_resolve(out, step_id, verdict, ...): ...

Each command's aliases (the command lines it had before the resource-first names, ``evq
enqueue``, ``evq db status``) are added by :func:`add_aliases` once the tree is built: hidden
from ``--help``, the same callback and parameters, so an alias cannot take different flags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from evq.ops.app.commands import COMMANDS, CREDENTIAL, GROUPS, Command, Kind, Param, command
from evq.ops.cli.auth import credential_callback


def table_group(name: str) -> click.Group:
    return click.Group(name, help=GROUPS[name])


def from_table(path: str, group: click.Group | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """The click command for table entry ``path`` around a command body (added to ``group``)."""
    entry = command(path)

    def decorate(fn: Callable[..., Any]) -> click.Command:
        cmd = click.Command(
            entry.words.split()[-1],
            callback=fn,
            params=[click_param(p, entry) for p in entry.params],
            help=help_text(entry, cli=True),
            short_help=entry.summary,
        )
        if group is not None:
            group.add_command(cmd)
        return cmd

    return decorate


def add_aliases(root: click.Group) -> None:
    """Every alias of every table command as a hidden command of ``root``'s tree."""
    for entry in COMMANDS.values():
        primary = find(root, entry.words)
        for alias in entry.aliases:
            *parents, name = alias.split()
            group = root
            for word in parents:
                sub = group.commands.get(word)
                if sub is None:
                    sub = click.Group(word, help=f"Old spellings of `evq {entry.group} ...` commands.", hidden=True)
                    group.add_command(sub)
                assert isinstance(sub, click.Group), alias
                group = sub
            assert name not in group.commands, f"alias {alias!r} is taken"
            group.add_command(
                click.Command(
                    name,
                    callback=primary.callback,
                    params=primary.params,
                    help=f"Alias of `evq {entry.words}`.\n\n{primary.help}",
                    short_help=f"Alias of `evq {entry.words}`.",
                    hidden=True,
                )
            )


def find(root: click.Group, words: str) -> click.Command:
    """The click command at a command line (``steps resolve``)."""
    cmd: click.Command = root
    for word in words.split():
        assert isinstance(cmd, click.Group), words
        cmd = cmd.commands[word]
    return cmd


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
    if not (p.setting or p.repeatable) and p.default is not None:
        options["default"] = p.default
    # No `default=None` otherwise: click 8.4 takes an explicit None as a value given, and stops
    # refusing a missing required option (`evq keys create` without --name reached the body).
    return click.Option([*p.flags, p.dest], type=kind, multiple=p.repeatable, **options)


def _click_type(p: Param) -> click.ParamType:
    if p.enum:
        return click.Choice(p.enum)
    if p.type == "integer":
        return click.IntRange(p.minimum, p.maximum) if (p.minimum, p.maximum) != (None, None) else click.INT
    if p.type == "number":
        return click.FloatRange(p.minimum, p.maximum) if (p.minimum, p.maximum) != (None, None) else click.FLOAT
    return click.STRING
