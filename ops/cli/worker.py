"""evq worker run: every setting is a flag here and an EVQ_* variable everywhere."""

from __future__ import annotations

from typing import Any

import click

from evq.ops import wiring
from evq.ops.cli.common import DocumentedOption, command, load_settings, output_option, run
from evq.ops.cli.output import Output
from evq.ops.settings import OPTIONS
from evq.worker.circuit import FAULTS

_CLICK_TYPES = {int: click.INT, float: click.FLOAT}


def _setting_options(fn: Any) -> Any:
    for option in reversed(OPTIONS):
        default = option.default
        if isinstance(default, frozenset):
            default = "all" if default == frozenset(FAULTS) else ",".join(sorted(default)) or "none"
        elif isinstance(default, tuple):
            default = ",".join(default)
        elif isinstance(default, bool):
            default = str(default).lower()
        shown = "(secret)" if option.secret else "(none)" if default in ("", None) else default
        fn = click.option(
            option.flag,
            option.name,
            cls=DocumentedOption,
            documented_default=None if option.secret else default,
            documented_envvar=option.env,
            type=click.Choice(option.choices) if option.choices else _CLICK_TYPES.get(option.parse, click.STRING),
            default=None,
            metavar=(option.choices and "|".join(option.choices))
            or option.parse.__name__.upper().replace("LOWERCASE_LIST", "LIST"),
            help=f"{option.help} [env: {option.env}; default: {shown}]",
        )(fn)
    return fn


@click.group("worker")
def worker_group() -> None:
    """Run the worker that sends queued email."""


@worker_group.command("run")
@_setting_options
@click.option("--drain", is_flag=True, help="Exit 0 once nothing is claimable now and nothing is in flight.")
@output_option
@command
def worker_run(out: Output, drain: bool, **settings_flags: Any) -> int:
    """Claim queued sends, send them through the adapter, record every outcome.

    The first SIGTERM or Ctrl-C stops claiming, hands back claimed rows not yet
    sent, and waits up to --shutdown-grace for sends in flight; a second one exits
    130 at once (rows in flight are then left to the rescuer, as after a crash).
    """
    settings = load_settings(**settings_flags)
    code = run(wiring.run_worker(settings, drain=drain))
    if out.json:
        out.success({"exit_code": code, "drain": drain})
    return code
