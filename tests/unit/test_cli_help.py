"""`--help` of every command fits a screen (issue 33), and nothing falls off it: every option is
described there or named, and every option of every command is in full in
docs/reference/commands.md (generated from the command table), every setting in docs/settings.md."""

from __future__ import annotations

import math
import re
from pathlib import Path

import click
from click.testing import CliRunner

from evq.ops.cli import cli
from evq.ops.cli.reference import PAGE, markdown
from evq.ops.cli.table import HELP_LINES, ScreenCommand, brief_help, screen_lines, short_help

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 80


def _commands(cmd: click.Command, words: tuple[str, ...] = ()):
    yield words, cmd
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _commands(sub, (*words, name))


def _help(words: tuple[str, ...]) -> str:
    done = CliRunner().invoke(cli, [*words, "--help"], terminal_width=WIDTH)
    assert done.exit_code == 0, (words, done.output)
    return done.output


def _screen_lines(text: str) -> int:
    """Lines on an 80-column terminal: a longer line (an example kept as written) takes more."""
    return sum(max(1, math.ceil(len(line) / WIDTH)) for line in text.splitlines())


def test_screen_lines_counts_what_a_terminal_shows():
    assert _screen_lines("a\n" + "b" * 81 + "\n\n") == 4 == screen_lines("a\n" + "b" * 81 + "\n\n", WIDTH)


COMMANDS = list(_commands(cli))


def test_every_commands_help_fits_a_screen():
    assert len(COMMANDS) > 40  # the root, the groups, every command and every alias
    too_long = {" ".join(words) or "evq": n for words, _ in COMMANDS if (n := _screen_lines(_help(words))) > HELP_LINES}
    assert too_long == {}


def test_worker_run_was_the_longest_and_now_shows_only_the_everyday_settings():
    text = _help(("worker", "run"))
    assert "--smtp-host" in text and "--drain" in text and "--database-url" in text
    assert "--smtp-password" not in text and "--approval-hours" not in text
    hidden = [p for p in cli.commands["worker"].commands["run"].params if getattr(p, "hidden", False)]
    assert len(hidden) > 50 and f"{len(hidden)} more settings are flags too (docs/settings.md)" in " ".join(
        text.split()
    )
    # Hidden from --help, not from the parser: a hidden setting still works as a flag.
    settings = (ROOT / "docs" / "settings.md").read_text()
    for p in hidden:
        assert f"| `{p.opts[0]}` |" in settings, p.opts


def test_every_option_is_described_or_named_in_its_help():
    for words, cmd in COMMANDS:
        if isinstance(cmd, click.Group):
            continue
        assert isinstance(cmd, ScreenCommand), words
        text = " ".join(_help(words).split())
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert max(p.opts, key=len) in text, (words, p.opts)
        assert f"evq schema {words[0]}." in text or "Alias of" in text, words


def test_a_help_too_long_for_the_screen_is_folded_not_cut():
    """steps enqueue has more options than a screen holds: the ones past it are named in one line."""
    text = _help(("steps", "enqueue"))
    assert "More options:" in text and "--priority" in text.split("More options:")[1]
    assert "--file F" in text and "-o, --output" in text and "--api-key KEY" in text
    wide = CliRunner().invoke(cli, ["steps", "enqueue", "--help"], terminal_width=400).output
    # A wider screen (evq's help is at most 110 columns) describes more of them.
    assert len(wide.split("More options:")[1]) < len(text.split("More options:")[1])


def test_short_and_brief_help_keep_the_meaning():
    assert short_help("A machine key for the verdict, e.g. found_in_provider_log.") == (
        "A machine key for the verdict, e.g. found_in_provider_log."
    )
    assert short_help("Read the request from F. JSON Lines enqueue many. [env: EVQ_X; default: 1]") == (
        "Read the request from F. [env: EVQ_X; default: 1]"
    )
    assert brief_help("Sender (default: EVQ_DEFAULT_FROM).") == "Sender (default: EVQ_DEFAULT_FROM)."
    assert brief_help("Whether it waits: always, policy or never.") == "Whether it waits."


def test_the_commands_reference_is_current_and_in_the_docs_site():
    # Regenerate: python3 -c 'from evq.ops.cli.reference import write; write()'
    page = (ROOT / PAGE).read_text()
    assert page == markdown()
    for words, cmd in COMMANDS:
        if isinstance(cmd, ScreenCommand) and not cmd.hidden:
            section = page.split(f"### `evq {' '.join(words)}`\n", 1)[1].split("\n### ", 1)[0]
            for p in cmd.params:
                if isinstance(p, click.Option) and (not p.hidden or p.name == "database_url"):
                    assert re.search(rf"`{re.escape(p.opts[0])}\b", section), (words, p.opts)
    assert "reference/commands.md" in (ROOT / "mkdocs.yml").read_text()
