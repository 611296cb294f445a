"""Every command, described once: the table the CLI's flags (ops/cli/table.py), `evq schema`
(ops/cli/describe.py), the HTTP API's input schemas and the MCP tools' input schemas
(ops/app/schemas.py) are all built from, so no interface can describe a parameter
differently from another.

A :class:`Command` is one leaf. Its ``path`` is its stable canonical name, ``group.action``
(``steps.resolve``), and every interface names it after that: the command line spells it as
words (``evq steps resolve``, resource first), the MCP tool is ``evq_steps_resolve``
(:func:`mcp_name`), the HTTP operation's ``operationId`` is ``steps.resolve``. Other command
lines that run the same command (the spellings before the resource-first names, ``evq enqueue``)
are its ``aliases``: they keep working, hidden from ``--help``, and `evq schema` lists them as
aliases of the one tool. What it is for (``use_when`` / ``avoid_when``), what it may change
(:class:`Effect`), how bad a mistake is (:class:`Risk`), whether to look first (``confirm``:
run it with ``--dry-run`` before), which permission its API key needs, its HTTP routes
(``http``), whether it is an MCP tool (``mcp``) and, when it lacks one of those, why
(``local_only``).

Its :class:`Param` s come in the order ``--help`` shows them. A parameter has one flag
(``--older-than``) and one JSON property (``older_than``: the name in an HTTP body or MCP
arguments); ``required`` means always, ``unless`` names the parameters (by dest) any of which
makes it unnecessary, e.g. `steps resolve`'s STEP_ID unless ``statuses``, `steps enqueue`'s
``--to`` unless ``file``. ``example`` is a value that passes validation, for callers (and the
test that builds every call from `evq schema` alone, tests/acceptance/test_schema_calls.py).

Adding a command: a :class:`Command` entry in its group's module's ``TABLE`` (steps.py, keys.py,
reports.py, admin.py; name it ``group.action``) and its path in ``_ORDER`` below (a new group gets a
line in groups.py's ``GROUPS`` and one in ``GROUP_WHEN``), its body in ops/cli/ decorated
``@from_table("group.action", group)``, its output schema ops/app/cli-schema/group-action.schema.json,
and, when it has them, its route in ops/web/api.py (``**operation("group.action")``) and its tool in
ops/mcp/server.py; then regenerate docs/schema-surface.json (CONTRIBUTING.md says how).
What each command does stays in its interface (ops/cli/*.py, ops/web/api.py,
ops/mcp/server.py), and what it prints in its output schema (ops/app/cli-schema/).

Neutral: nothing here knows click, FastAPI or MCP.
"""

from __future__ import annotations

from evq.ops.app.commands import admin, keys, reports, steps
from evq.ops.app.commands.groups import GROUP_WHEN, GROUPS
from evq.ops.app.commands.model import CREDENTIAL, Command, Effect, Kind, Param, Risk, Route, mcp_name
from evq.ops.app.commands.params import BENCH_MODES

# What the interfaces import from here (the table's one public face).
__all__ = [
    "BENCH_MODES",
    "CLI_PATHS",
    "COMMANDS",
    "CREDENTIAL",
    "GROUPS",
    "GROUP_WHEN",
    "SOURCES",
    "Command",
    "Effect",
    "Kind",
    "Param",
    "Risk",
    "Route",
    "command",
    "in_group",
    "lookup",
    "mcp_name",
]

# The order every interface lists the commands in (`evq schema`, the HTTP API's operations, the MCP
# tools, docs/schema-surface.json): as it was when the table was one module.
_ORDER: tuple[str, ...] = (
    "admin.health",
    "admin.bench",
    "admin.db-version",
    "admin.db-upgrade",
    "admin.demo",
    "deliveries.list",
    "events.list",
    "keys.create",
    "keys.list",
    "keys.revoke",
    "keys.update",
    "admin.mcp",
    "policy.show",
    "providers.list",
    "refusals.list",
    "steps.prune",
    "runs.show",
    "schema.show",
    "admin.serve",
    "steps.enqueue",
    "steps.list",
    "steps.resolve",
    "steps.approve",
    "steps.deny",
    "steps.cancel",
    "steps.show",
    "steps.wait",
    "worker.run",
)
_GROUP_MODULES = (admin, keys, reports, steps)
_BY_PATH: dict[str, Command] = {c.path: c for m in _GROUP_MODULES for c in m.TABLE}
assert set(_BY_PATH) == set(_ORDER) and len(_ORDER) == sum(len(m.TABLE) for m in _GROUP_MODULES)
_TABLE: tuple[Command, ...] = tuple(_BY_PATH[p] for p in _ORDER)
# The file each command is described in, for `evq schema`'s agent_source_refs.
SOURCES: dict[str, str] = {
    c.path: f"ops/app/commands/{m.__name__.rsplit('.', 1)[1]}.py" for m in _GROUP_MODULES for c in m.TABLE
}

COMMANDS: dict[str, Command] = {c.path: c for c in _TABLE}
# Every command line (after `evq`) that runs a command: its own, then its aliases.
CLI_PATHS: dict[str, tuple[Command, bool]] = {
    **{c.words: (c, False) for c in _TABLE},
    **{alias: (c, True) for c in _TABLE for alias in c.aliases},
}


def command(path: str) -> Command:
    return COMMANDS[path]


def lookup(name: str) -> tuple[Command, bool] | None:
    """The command ``name`` names, and whether through an alias: a canonical path
    (``steps.resolve``), a command line (``steps resolve``) or an alias (``enqueue``,
    ``db.status``, ``db status``)."""
    words = " ".join(name.replace(".", " ").split())
    if name in COMMANDS:
        return COMMANDS[name], False
    return CLI_PATHS.get(words)


def in_group(group: str) -> list[Command]:
    return [c for path, c in sorted(COMMANDS.items()) if c.group == group]
