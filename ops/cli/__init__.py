"""The `evq` command line: `evq <noun> <verb>`, human tables by default, `-o json` for agents."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

# Each module adds its commands to its group (ops/cli/admin.py's, ops/cli/steps.py's...).
from evq.ops.cli import approvals, bench, db, demo, enqueue, health, mcptools, prune, serve  # noqa: F401
from evq.ops.cli.admin import admin
from evq.ops.cli.deliveries import deliveries
from evq.ops.cli.events import events
from evq.ops.cli.keys import keys
from evq.ops.cli.output import EXIT_CODES, EXIT_INTERRUPTED, Output, json_requested
from evq.ops.cli.policy import policy
from evq.ops.cli.providers import providers
from evq.ops.cli.refusals import refusals
from evq.ops.cli.runs import runs
from evq.ops.cli.schema import schema
from evq.ops.cli.steps import steps
from evq.ops.cli.table import add_aliases
from evq.ops.cli.worker import worker_group
from evq.worker.errors import InvalidRequest
from evq.worker.logs import configure_from_env


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="evq", prog_name="evq")
def cli() -> None:
    """evq: an evidence queue for email sends decided by AI agents.

    Every send is recorded once, sent at most once, and provable afterwards: the
    decision, the request, each attempt and the provider's answer are rows in
    PostgreSQL. A send whose outcome nobody can know becomes `unknown` and waits
    for an operator instead of being sent twice.

    \b
    Start here:  evq admin demo
    Set up:      evq admin db-upgrade ; evq keys create --name NAME --role admin
    Send:        evq steps enqueue --file request.json   (or --run-id, --to...)
    Work:        evq worker run ; evq admin serve (HTTP API, /ops, /metrics)
    Agents:      evq admin mcp (MCP, stdio) ; evq schema (every command, in JSON)
    Look:        evq steps list --status unknown ; evq steps show ID
    Close:       evq steps resolve ID --as accepted|rejected|retry --note "..."
    Approve:     evq steps list --status held ; evq steps approve|deny ID
    Check:       evq admin health ; evq providers list ; evq events list

    Older spellings (`evq enqueue`, `evq serve`...) still work. Settings are EVQ_*
    variables (docs/settings.md); EVQ_DATABASE_URL names the database (`embedded`:
    evq's own; only `evq admin demo` starts one unasked). Commands that change
    rows need an API key (EVQ_API_KEY or --api-key).
    """


for group in (admin, deliveries, events, keys, policy, providers, refusals, runs, schema, steps, worker_group):
    cli.add_command(group)
# The spellings before the resource-first names (`evq enqueue`, `evq db status`...), hidden.
add_aliases(cli)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    configure_from_env()
    try:
        _refuse_undecodable(args)
        code = cli.main(args=args, prog_name="evq", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.UsageError as exc:
        if json_requested(args):
            code = Output("json").error(InvalidRequest([{"field": _param_name(exc), "message": exc.format_message()}]))
        else:
            exc.show()
            code = EXIT_CODES["E_INVALID_ARG"]
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        code = EXIT_INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def _refuse_undecodable(args: list[str]) -> None:
    """Bytes that are not UTF-8 reach Python as lone surrogates, which no database or JSON
    output can carry: refuse them here, for every command, as the bad argument they are."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise click.UsageError(f"argument {ascii(arg)[:80]} is not valid UTF-8") from None


def _param_name(exc: click.UsageError) -> str:
    param = getattr(exc, "param", None)
    if param is not None and getattr(param, "opts", None):
        return param.opts[0]
    return "$args"
