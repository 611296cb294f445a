"""docs/reference/commands.md: every command with every option in full, made from the command
table and the click tree built from it, so the page says what `--help` would with no screen to
fit (`--help` gives each option a sentence, or names it: ops/cli/table.py). A test keeps the page
equal to :func:`markdown`; regenerate it with

    python3 -c 'from evq.ops.cli.reference import write; write()'
"""

from __future__ import annotations

from pathlib import Path

import click

from evq.ops.app.commands import COMMANDS, GROUPS, Command, Kind, Param
from evq.ops.cli.table import EVERYDAY_SETTINGS, find

PAGE = Path("docs") / "reference" / "commands.md"

_HEAD = """# Every command

Every command of `evq`, with every option in full (`evq <group> <action> --help` shows each one's
first sentence, within a screen). The same comes as JSON from `evq schema <command> -o json`, with
each option's type, bounds and an example. Settings are flags of `evq worker run` too: every one
is in [the settings](../settings.md). This page is generated from the command table
(`python3 -c 'from evq.ops.cli.reference import write; write()'`); a test keeps it current.
"""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _option(p: Param, cmd: click.Command, ctx: click.Context) -> str:
    param = next(q for q in cmd.params if q.name == p.dest)
    if p.kind is Kind.ARGUMENT:
        name = f"`{p.dest.upper()}`" + (" ..." if p.repeatable else "")
    elif p.enum:
        # Choices go to the notes: a code span in a table cell cannot hold their "|".
        name = f"`{', '.join(param.opts)}{'' if p.kind is Kind.FLAG else ' ' + p.dest.upper()}`"
    else:
        record = param.get_help_record(ctx)
        assert record is not None, p.dest
        name = f"`{record[0]}`"
    facts = [f"one of {', '.join(f'`{c}`' for c in p.enum)}"] if p.enum else []
    if p.required:
        facts.append("required")
    elif p.required_text:
        facts.append(p.required_text)
    if p.repeatable and p.kind is not Kind.ARGUMENT:
        facts.append("repeatable")
    if p.env:
        facts.append(f"env `{p.env}`")
    if p.default not in (None, (), "", False) and not p.setting:
        facts.append(f"default `{p.default}`")
    return f"| {name} | {_cell(p.help)} | {_cell('; '.join(facts))} |"


def _command(entry: Command, root: click.Group) -> list[str]:
    cmd = find(root, entry.words)
    ctx = click.Context(cmd, info_name=entry.words.split()[-1])
    lines = [f"### `evq {entry.words}`", "", entry.help.strip(), ""]
    if entry.examples:
        lines += ["```sh", *entry.examples, "```", ""]
    if entry.aliases:
        lines += ["Also spelled " + ", ".join(f"`evq {a}`" for a in entry.aliases) + ".", ""]
    # `evq worker run`'s settings: the everyday ones here, as in its --help; all of them in the settings' page.
    shown = [p for p in entry.params if not p.setting or p.dest in EVERYDAY_SETTINGS or entry.path != "worker.run"]
    lines += ["| option | meaning | notes |", "|---|---|---|"]
    lines += [_option(p, cmd, ctx) for p in shown]
    lines.append("")
    if len(shown) < len(entry.params):
        lines += [
            f"And every other setting as its flag ({len(entry.params) - len(shown)}): [the settings](../settings.md).",
            "",
        ]
    return lines


def markdown() -> str:
    from evq.ops.cli import cli

    lines = [_HEAD]
    for group in sorted(GROUPS):
        entries = [e for e in COMMANDS.values() if e.group == group]
        if not entries:
            continue
        lines += [f"## {group}", "", GROUPS[group], ""]
        for entry in sorted(entries, key=lambda e: e.words):
            lines += _command(entry, cli)
    return "\n".join(lines).rstrip() + "\n"


def write(root: Path = Path(".")) -> None:
    (root / PAGE).write_text(markdown())
