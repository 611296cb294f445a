"""The command line built from the command table (ops/app/commands/): every click
option and argument, every command's help and every group's, so a flag cannot be
described one way here and another in `evq schema`, the HTTP API or the MCP tools.

    @from_table("steps.resolve", steps)
    @command
    def steps_resolve(out, step_id, verdict, ...): ...

Each command's aliases (the command lines it had before the resource-first names, ``evq
enqueue``, ``evq db status``) are added by :func:`add_aliases` once the tree is built: hidden
from ``--help``, the same callback and parameters, so an alias cannot take different flags.

``--help`` fits a screen (at most :data:`HELP_LINES` lines at 80 columns, every command:
tests/unit/test_cli_help.py): options say less where all would not fit (:class:`ScreenCommand`), and `evq worker run`
shows only the settings a first run turns (:data:`EVERYDAY_SETTINGS`), the others being
flags all the same. Everything in full, from the same table: `evq schema <command>` and
docs/reference/commands.md (:func:`evq.ops.cli.reference.markdown`).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from typing import Any

import click

from evq.ops.app.commands import COMMANDS, CREDENTIAL, GROUPS, Command, Kind, Param, command
from evq.ops.cli.auth import credential_callback

# The most lines `evq <command> --help` prints at 80 columns: a screen.
HELP_LINES = 40
# The settings `evq worker run --help` lists; every other is a flag too, listed in docs/settings.md.
EVERYDAY_SETTINGS = ("database_url", "adapter", "concurrency", "smtp_host", "smtp_port", "metrics_port")
FULL_REFERENCE = "docs/reference/commands.md"
# The options every command that has them describes in full: the key, the output, the database, --dry-run.
SHARED = frozenset({CREDENTIAL, "output", "database_url", "dry_run"})


def table_group(name: str) -> click.Group:
    return click.Group(name, help=GROUPS[name])


def from_table(path: str, group: click.Group | None = None) -> Callable[[Callable[..., Any]], click.Command]:
    """The click command for table entry ``path`` around a command body (added to ``group``)."""
    entry = command(path)

    def decorate(fn: Callable[..., Any]) -> click.Command:
        cmd = ScreenCommand(
            entry.words.split()[-1],
            callback=fn,
            params=[click_param(p, entry) for p in entry.params],
            help=help_text(entry, cli=True),
            short_help=entry.summary,
            epilog=_epilog(entry),
            keep=_kept(entry),
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
                ScreenCommand(
                    name,
                    callback=primary.callback,
                    params=primary.params,
                    help=f"Alias of `evq {entry.words}`.\n\n{primary.help}",
                    short_help=f"Alias of `evq {entry.words}`.",
                    epilog=primary.epilog,
                    hidden=True,
                    keep=_kept(entry),
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


class ScreenCommand(click.Command):
    """A table command whose --help fits :data:`HELP_LINES` lines at the terminal's width. Each
    option says its whole help if that fits; else its first sentence; else its first clause;
    else the options that do not fit, the table's last first, are named in one paragraph
    instead of described (``keep``: the dests always described). They work the same either way."""

    def __init__(self, *args: Any, keep: frozenset[str] = frozenset(), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep = keep

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        foldable = [
            p for p in reversed(self.params) if isinstance(p, click.Option) and not p.hidden and p.name not in self.keep
        ]
        level, folded = 0, list[click.Parameter]()
        while True:
            trial = ctx.make_formatter()
            self._write(ctx, trial, level, folded)
            if screen_lines(trial.getvalue(), formatter.width) <= HELP_LINES or (level == 2 and not foldable):
                break
            if level < 2:
                level += 1
            else:
                folded.append(foldable.pop(0))
        self._write(ctx, formatter, level, folded)

    def _write(
        self, ctx: click.Context, formatter: click.HelpFormatter, level: int, folded: list[click.Parameter]
    ) -> None:
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        records = [r for p in self.get_params(ctx) if p not in folded and (r := _record(p, ctx, level)) is not None]
        if records:
            with formatter.section("Options"):
                formatter.write_dl(records)
        if folded:
            names = ", ".join(max(p.opts, key=len) for p in self.params if p in folded)
            formatter.write_paragraph()
            with formatter.indentation():
                # Wrapped here, never inside a flag (click's wrapping breaks --instruction-version).
                width = max(formatter.width - formatter.current_indent, 40)
                for line in textwrap.wrap(f"More options: {names}.", width, break_on_hyphens=False):
                    formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
        self.format_epilog(ctx, formatter)


def screen_lines(text: str, width: int) -> int:
    """Lines on a terminal ``width`` columns wide: a longer line (an example kept as written) takes more."""
    return sum(max(1, -(-len(line) // width)) for line in text.splitlines())


def _record(p: click.Parameter, ctx: click.Context, level: int) -> tuple[str, str] | None:
    """An option's line of --help at ``level``: 0 its whole help, 1 its first sentence, 2 its first
    clause (the options every command shares keep their sentence: `-o json` is how an agent reads evq)."""
    if level == 0 or not isinstance(p, click.Option) or not p.help:
        return p.get_help_record(ctx)
    full = p.help
    try:
        p.help = brief_help(full) if level > 1 and p.name not in SHARED else short_help(full)
        return p.get_help_record(ctx)
    finally:
        p.help = full


def _kept(entry: Command) -> frozenset[str]:
    """What a command's --help always describes: what is required, what stands in for it, and
    the options every command shares (the key, the output, the database, --dry-run)."""
    unless = {d for p in entry.params for d in p.unless}
    return frozenset(
        p.dest for p in entry.params if p.required or p.unless or p.dest in unless or p.local or p.dest in SHARED
    )


def _epilog(entry: Command) -> str:
    hidden = sum(1 for p in entry.params if _hidden(p, entry))
    more = f"{hidden} more settings are flags too (docs/settings.md). " if hidden else ""
    return f"{more}Every option in full: `evq schema {entry.path}`, {FULL_REFERENCE}."


def _hidden(p: Param, entry: Command) -> bool:
    """A setting left out of a command's --help that has many (`evq worker run`): it stays a flag."""
    many = sum(1 for q in entry.params if q.setting) > len(EVERYDAY_SETTINGS)
    return many and p.setting and p.dest not in EVERYDAY_SETTINGS


# A sentence ends at . ! or ? before a capital, a quote or a parenthesis (so "e.g. x" goes on).
_SENTENCE_END = re.compile(r"(?<=[^.][.!?])\s+(?=[A-Z(`'\"])")


def short_help(text: str) -> str:
    """An option's help in --help: its first sentence, with the [env: ...; default: ...] it ends with."""
    tail = re.search(r"\s*\[env: [^\]]*\]$", text)
    body = text[: tail.start()] if tail else text
    first = _SENTENCE_END.split(body, maxsplit=1)[0]
    return first + (tail.group(0) if tail else "")


def brief_help(text: str) -> str:
    """An option's first clause (up to "; " or ": " outside parentheses, once it says a dozen
    characters), for a --help that its first sentences would not fit on a screen."""
    text = re.sub(r"\s*\[env: [^\]]*\]", "", short_help(text))
    depth = 0
    for i, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c in ";:" and depth == 0 and i >= 12 and text[i + 1 : i + 2] == " ":
            return text[:i] + "."
    return text


def click_param(p: Param, entry: Command) -> click.Parameter:
    kind = _click_type(p)
    if p.kind is Kind.ARGUMENT:
        return click.Argument([p.dest], type=kind, required=p.required, nargs=-1 if p.repeatable else 1)
    options: dict[str, Any] = {
        "help": p.help or None,
        "hidden": _hidden(p, entry),
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
