"""What the command table is made of: a :class:`Command` (one leaf), its :class:`Param` s, what it
may change (:class:`Effect`), how bad a mistake is (:class:`Risk`), its HTTP :class:`Route` s."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from evq.worker.keys import ALLOWED, Permission

API_KEY_ENV = "EVQ_API_KEY"
# The parameter that carries the API key; the CLI turns it into a Credential (ops/cli/auth.py).
CREDENTIAL = "credential"


class Effect(StrEnum):
    """The most one run of a command can do, for an agent deciding whether to ask first."""

    READ = "read"  # changes nothing
    WRITE = "write"  # changes evq's rows or its database, sends nothing
    SEND = "send"  # can make email leave


class Risk(StrEnum):
    """How much a mistaken run costs, for an agent deciding how careful to be."""

    LOW = "low"  # nothing that cannot be run again or ignored
    MEDIUM = "medium"  # changes rows or starts a process, undone by another command
    HIGH = "high"  # sends email, or removes or closes something for good


class Kind(StrEnum):
    ARGUMENT = "argument"  # positional: STEP_ID
    OPTION = "option"  # --flag VALUE
    FLAG = "flag"  # --flag, a boolean


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter of one command.

    ``dest`` is the keyword the command body receives. ``flags`` default to ``--dest``
    with dashes (none for an argument), ``property`` to the first flag (or the argument)
    as a JSON name. ``default`` is what applies when the parameter is not given;
    with ``setting`` it is applied by the settings loader (ops/settings.py), which
    reads ``env`` first, so the flag parser must not fill it in. ``local``: the command
    line's only (the key, the output format, the database URL): the HTTP API and the
    MCP server take those from their own request or environment.

    ``unless``: not ``required``, but needed unless one of these parameters (dests) is
    given, or ``unless_env`` is set in the environment; ``required_text`` says so in words.
    ``example``: a value that passes validation, shown by `evq schema`. ``max_length``:
    the most characters of a string, the JSON schemas' ``maxLength`` and the HTTP query's
    bound, checked by check_arguments; it must be the service's own limit (``search``:
    SEARCH_MAX), so no interface promises more than the service takes.
    """

    dest: str
    kind: Kind = Kind.OPTION
    help: str = ""
    type: str = "string"  # a JSON type: string, integer, number, boolean
    flags: tuple[str, ...] = ()
    property: str = ""
    required: bool = False
    default: Any = None
    enum: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    max_length: int | None = None  # a string's most characters: every interface states and checks it
    repeatable: bool = False
    env: str | None = None
    setting: bool = False
    local: bool = False
    metavar: str | None = None
    show_default: bool = False
    unless: tuple[str, ...] = ()
    unless_env: str | None = None
    required_text: str = ""
    example: Any = None

    def __post_init__(self) -> None:
        if self.kind is Kind.FLAG:
            object.__setattr__(self, "type", "boolean")
            object.__setattr__(self, "default", bool(self.default))
        if not self.flags and self.kind is not Kind.ARGUMENT:
            object.__setattr__(self, "flags", ("--" + self.dest.replace("_", "-"),))
        if not self.property:
            object.__setattr__(self, "property", json_name(self.flag or self.dest))
        if self.repeatable and self.default is None:
            object.__setattr__(self, "default", ())

    @builtins.property  # this class has a field named `property`
    def flag(self) -> str | None:
        """The long flag (``--output`` of ``-o, --output``); None for an argument."""
        longs = [f for f in self.flags if f.startswith("--")]
        return longs[0] if longs else (self.flags[0] if self.flags else None)

    @builtins.property
    def key(self) -> str:
        """Its name in `evq schema`: the long flag without ``--`` (``older-than``), or an argument's
        metavar as ``--help`` shows it (``STEP_ID``)."""
        return self.dest.upper() if self.kind is Kind.ARGUMENT else (self.flag or "").lstrip("-")


def json_name(flag_or_dest: str) -> str:
    """``--older-than`` -> ``older_than``."""
    return flag_or_dest.lstrip("-").replace("-", "_").lower()


@dataclass(frozen=True, slots=True)
class Route:
    """One HTTP operation of a command: ``POST /v1/steps``. The first route of a command has
    its canonical name as ``operationId``; another is ``<path>.<name>``."""

    method: str
    path: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class Command:
    """One leaf command. ``path`` is its stable canonical name (``steps.resolve``); the command
    line spells it as words (``evq steps resolve``) unless ``cli`` says otherwise."""

    path: str
    summary: str
    help: str
    effect: Effect
    params: tuple[Param, ...]
    permission: Permission | None = None  # what its API key needs; None: it takes no key
    examples: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # other command lines for it, as words: "enqueue", "db status"
    cli: str | None = None  # its command line when it is not the path's words
    use_when: str = ""
    avoid_when: str = ""
    risk: Risk = Risk.LOW
    confirm: bool = False  # look first: run it with --dry-run, then for real
    http: tuple[Route, ...] = ()
    mcp: bool = False  # an MCP tool, named mcp_name(path)
    local_only: str = ""  # why it has no HTTP route or MCP tool
    # Running it again with the same arguments changes nothing more (a read always; `steps
    # enqueue`: the same key is the same step). The MCP tools' idempotentHint.
    idempotent: bool = False

    def __post_init__(self) -> None:
        assert self.path.count(".") == 1, f"{self.path}: a canonical path is group.action"
        assert self.use_when and self.avoid_when, f"{self.path}: say when to use it and when not"
        assert not self.confirm or any(p.dest == "dry_run" for p in self.params), self.path
        assert (self.http and self.mcp) or self.local_only, f"{self.path}: say why it has no route or tool"

    @property
    def words(self) -> str:
        """Its command line after ``evq``: ``steps resolve``."""
        return self.cli or self.path.replace(".", " ")

    @property
    def group(self) -> str:
        return self.path.split(".")[0]

    @property
    def action(self) -> str:
        return self.path.split(".")[1]

    @property
    def repeatable(self) -> bool:
        """Whether a repeat of the same call is harmless: every read, and the writes that say so."""
        return self.effect is Effect.READ or self.idempotent

    @property
    def mcp_tool(self) -> str | None:
        return mcp_name(self.path) if self.mcp else None

    def operation_id(self, route: Route) -> str:
        return self.path + (f".{route.name}" if route.name else "")

    @property
    def roles(self) -> list[str]:
        """The key roles that may run it (worker/keys.py), in the order they are granted."""
        return [] if self.permission is None else [str(r) for r in ALLOWED[self.permission]]

    def param(self, dest: str) -> Param:
        return next(p for p in self.params if p.dest == dest)


def mcp_name(path: str) -> str:
    """``steps.resolve`` -> ``evq_steps_resolve``; ``admin.db-version`` -> ``evq_admin_db_version``."""
    return "evq_" + path.replace(".", "_").replace("-", "_")
