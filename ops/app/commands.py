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

Adding a command: a :class:`Command` entry in ``_TABLE`` (name it ``group.action``; a new group
gets a line in ``GROUPS`` and one in ``GROUP_WHEN``), its body in ops/cli/ decorated
``@from_table("group.action", group)``, its output schema ops/app/cli-schema/group-action.schema.json,
and, when it has them, its route in ops/web/api.py (``**operation("group.action")``) and its tool in
ops/mcp/server.py; then regenerate docs/schema-surface.json (CONTRIBUTING.md says how).
What each command does stays in its interface (ops/cli/*.py, ops/web/api.py,
ops/mcp/server.py), and what it prints in its output schema (ops/app/cli-schema/).

Neutral: nothing here knows click, FastAPI or MCP.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from evq.ops.app.service import (
    DECISION_FIELDS,
    EVENTS_LIMIT_MAX,
    FILTER_MAX_LENGTH,
    FILTERS,
    HEADERS_HELP,
    LIST_LIMIT_MAX,
    MAX_ATTEMPTS_HELP,
    MAX_ID,
    PRIORITY_HELP,
    REQUIRE_APPROVAL_HELP,
    SEND_AT_HELP,
)
from evq.ops.app.service import REQUEST_FIELDS as SEND_FIELDS
from evq.ops.app.waiting import WAIT_DEFAULT
from evq.ops.settings import OPTIONS, Option
from evq.worker.approval import PRIORITIES, KeyApproval
from evq.worker.circuit import FAULTS
from evq.worker.keys import ALLOWED, Permission, Role
from evq.worker.pruner import RETENTION_HELP
from evq.worker.resolution import Verdict
from evq.worker.states import Status
from evq.worker.verdict import NEXT_ACTIONS

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
    with ``setting`` it is applied by the settings loader (worker/settings.py), which
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


# -- parameters several commands share -------------------------------------------

OUTPUT = Param(
    "output",
    flags=("-o", "--output"),
    enum=("table", "json"),
    default="table",
    show_default=True,
    local=True,
    help="table for people; json for scripts and agents (one object on stdout).",
)
DATABASE_URL = Param(
    "database_url",
    env="EVQ_DATABASE_URL",
    setting=True,
    local=True,
    metavar="URL",
    help="PostgreSQL URL, or `embedded` for evq's own [env: EVQ_DATABASE_URL].",
)
DRY_RUN = Param("dry_run", Kind.FLAG, help="Print exactly what would change, change nothing; needs no API key.")


def api_key(permission: Permission) -> Param:
    roles = " or ".join(str(r) for r in ALLOWED[permission])
    return Param(
        CREDENTIAL,
        flags=("--api-key",),
        env=API_KEY_ENV,
        local=True,
        metavar="KEY",
        help=f"API key with role {roles} [env: {API_KEY_ENV}; prefer the variable: flags show in `ps`]. "
        "Not needed with --dry-run.",
        unless=("dry_run",),
        unless_env=API_KEY_ENV,
        required_text=f"required unless --dry-run is given or {API_KEY_ENV} is set",
    )


# Reading needs no key on the command line; this one only decides whether the message
# content is shown (Permission.READ_CONTENT), so it is not the CREDENTIAL of a write.
CONTENT_KEY = Param(
    "content_key",
    flags=("--api-key",),
    env=API_KEY_ENV,
    local=True,
    metavar="KEY",
    help="API key whose role decides whether the message text and html are shown "
    f"({' or '.join(str(r) for r in ALLOWED[Permission.READ_CONTENT])}: shown; none or another role: "
    f"sizes and SHA-256 only) [env: {API_KEY_ENV}]. A key that is not valid is refused.",
)


def _page(rows: str, *, default: int = 50, maximum: int = LIST_LIMIT_MAX) -> tuple[Param, ...]:
    """A page by limit and offset, as every list shares it (the contract's meta: count, total,
    limit, offset): meta.total counting every row that matches (a cursor's lists: from the cursor
    on), --offset skipping that many of them."""
    return (
        Param(
            "limit",
            type="integer",
            minimum=1,
            maximum=maximum,
            default=default,
            show_default=True,
            help=f"{rows} per page.",
        ),
        Param(
            "offset",
            type="integer",
            minimum=0,
            maximum=MAX_ID,
            default=0,
            show_default=True,
            help=f"{rows} to skip (meta.total counts them all).",
        ),
    )


def _filters() -> tuple[Param, ...]:
    """The filters `steps list` and bulk `steps resolve` share (ops/app/service.py's FILTERS)."""
    examples = {
        "older_than": "2h",
        "recipient_domain": "example.com",
        "run_id": "r1",
        "provider": "smtp",
        "search": "bob@example.com",
    }
    return tuple(
        Param(
            name,
            metavar=metavar,
            help=help_text,
            example=examples.get(name),
            max_length=FILTER_MAX_LENGTH.get(name),
        )
        for name, metavar, help_text in FILTERS
    )


_SEND_FIRST = ("run_id", "step_id", "to", "from", "subject", "text", "html", "intent")


def _send_request() -> tuple[Param, ...]:
    """The send request's fields as flags: the same field table request_schema() reads."""
    # What every send needs comes first in `--help` (issue 18: a newcomer read past the
    # optional and decision flags to find them); the rest keep the field table's order.
    ordered = sorted(SEND_FIELDS, key=lambda f: _SEND_FIRST.index(f[0]) if f[0] in _SEND_FIRST else len(_SEND_FIRST))
    fields = tuple(
        Param(name, repeatable=multiple, help=help_text, example=_SEND_EXAMPLES.get(name), **_send_required(name))
        for name, multiple, help_text in ordered
    )
    decision = tuple(
        Param(
            "decision_" + name,
            flags=("--" + name.replace("_", "-"),),
            property="decision." + name,
            help=help_text,
            example=_SEND_EXAMPLES.get(name),
        )
        for name, help_text in DECISION_FIELDS
    )
    return (
        *fields,
        *decision,
        Param(
            "headers",
            flags=("--header",),
            property="headers",
            repeatable=True,
            metavar="'NAME: VALUE'",
            help=HEADERS_HELP,
            example="In-Reply-To: <m1@example.org>",
        ),
        Param("max_attempts", type="integer", help=MAX_ATTEMPTS_HELP, example=3),
        Param("require_approval", Kind.FLAG, help=REQUIRE_APPROVAL_HELP),
        Param("send_at", metavar="ISO8601", help=SEND_AT_HELP, example="2026-05-01T09:00:00+02:00"),
        Param("priority", enum=tuple(PRIORITIES), help=PRIORITY_HELP, example="high"),
    )


_SEND_EXAMPLES = {
    "run_id": "r1",
    "step_id": "welcome",
    "to": "bob@example.com",
    "cc": "carol@example.com",
    "bcc": "dave@example.com",
    "from": "agent@example.org",
    "reply_to": "support@example.org",
    "subject": "Hello",
    "text": "Hi Bob",
    "html": "<p>Hi Bob</p>",
    "intent": "welcome Bob",
    "notify": "agent-owner@example.org",
    "idempotency_key": "r1:welcome",
    "instruction_version": "v3",
    "prompt_version": "p7",
    "model": "model-x",
    "tool": "send_email",
    "rationale": "new signup",
    "decided_at": "2026-12-01T10:00:00Z",
}


def _send_required(name: str) -> dict[str, Any]:
    """What worker/request.py refuses a request without, as the flags' conditions: a request
    from --file is the file's business."""
    if name in ("run_id", "step_id", "to", "subject"):
        flag = "--" + name.replace("_", "-")
        return {"unless": ("file",), "required_text": f"{flag} is required when --file is not given"}
    if name == "from":
        return {
            "unless": ("file",),
            "unless_env": "EVQ_DEFAULT_FROM",
            "required_text": "required when --file is not given and EVQ_DEFAULT_FROM (the default sender) is not set",
        }
    if name in ("text", "html"):
        other = "html" if name == "text" else "text"
        return {
            "unless": (other, "file"),
            "required_text": f"a body: --text or --html (or both) when --file is not given; this one unless --{other}",
        }
    return {}


_TYPES = {int: "integer", float: "number"}


def _setting(option: Option) -> Param:
    """An EVQ_* setting as a flag of `evq worker run`: the loader applies its default."""
    default = option.default
    if isinstance(default, frozenset):
        default = "all" if default == frozenset(FAULTS) else ",".join(sorted(default)) or "none"
    elif isinstance(default, tuple):
        default = ",".join(default)
    elif isinstance(default, bool):
        default = str(default).lower()
    shown = "(secret)" if option.secret else "(none)" if default in ("", None) else default
    return Param(
        option.name,
        type=_TYPES.get(option.parse, "string"),
        enum=option.choices,
        default=None if option.secret else default,
        env=option.env,
        setting=True,
        metavar=(option.choices and "|".join(option.choices)) or option.parse.__name__.upper().replace("_CSV", "LIST"),
        help=f"{option.help} [env: {option.env}; default: {shown}]",
    )


# -- the table -------------------------------------------------------------------

# The groups' one line each, for `evq schema` and `evq GROUP --help`.
GROUPS: dict[str, str] = {
    "admin": "Run and look after an installation: its health, the database schema, the HTTP and MCP servers, the demo, "
    "the benchmark.",
    "deliveries": "What providers' webhooks said became of each message: delivered, deferred, bounced, complained.",
    "events": "Each API key's event feed: every rejection, unknown and operator verdict on the sends it enqueued.",
    "keys": "Manage API keys: who may change rows, and the name evidence records them by.",
    "policy": "The approval policy: which sends wait for a person, and the blast-radius budgets.",
    "providers": "The email providers evq sends through, and their circuits.",
    "refusals": "Enqueues evq refused: what agents asked, by which key, and every failing field.",
    "runs": "Read back an agent run: every step it decided, and everything that happened to each.",
    "schema": "Describe evq's commands for scripts and agents, a level at a time.",
    "steps": "Email steps: enqueue a send, read back (or wait for) its state and evidence, close unknown ones, "
    "prune old ones.",
    "worker": "Run the worker that sends queued email.",
}
# When an agent should pick each group and when another (`evq schema`'s products: the schema
# contract's routing, as each command's use_when / avoid_when is for its tools).
GROUP_WHEN: dict[str, tuple[str, str]] = {
    "admin": (
        "setting up or looking after an installation: its health first, the database schema, the servers",
        "working with sends: `steps` has them",
    ),
    "deliveries": (
        "what a provider's webhook said became of a message after it was accepted: delivered, bounced, complained",
        "whether evq sent a message: `steps show` has the step's own state",
    ),
    "events": (
        "an agent catching up on every send of its own that was rejected, became unknown or got a verdict",
        "waiting on one send: `steps wait` answers when it is worth acting on",
    ),
    "keys": (
        "an administrator giving a holder its own API key, revoking one, or pointing a key's failures somewhere",
        "an agent's run: keys are managed where the database is, never over HTTP or MCP",
    ),
    "policy": (
        "before a batch: which sends will wait for a person, and how much of each budget is left",
        "why one send is held: `steps show` has its hold",
    ),
    "providers": (
        "sends are not going out, or before a batch: is a provider down, and can it settle a lost answer?",
        "one send's state: `steps show`",
    ),
    "refusals": (
        "finding out what an agent asked for and why evq refused it",
        "sends that were accepted and then failed: `steps list` and `events list` have those",
    ),
    "runs": (
        "auditing an agent run: every step it decided and what became of each",
        "following one send: `steps show` is shorter",
    ),
    "schema": (
        "before calling a command: what it takes, what it prints, what it may change",
        "doing the work itself: the other products' tools do it",
    ),
    "steps": (
        "an agent sending an email and following it, or an operator approving, denying or closing sends",
        "sending again a step that is held or unknown: wait, or ask an operator",
    ),
    "worker": (
        "running the installation: workers are what send queued email",
        "with a real provider configured on a test database: it sends what is queued",
    ),
}
assert set(GROUP_WHEN) == set(GROUPS), "every group says when to use it and when not"

NOTIFY_EMAIL_HELP = (
    "The key's default notification target: told of every rejected send the key enqueued "
    "whose request named no notify address."
)
NOTIFY_URL_HELP = (
    "A callback URL: evq POSTs each of the key's events (rejected, unknown, verdict) to it as JSON, signed "
    "the Standard Webhooks way (webhook-id, webhook-timestamp, webhook-signature); the secret is printed once."
)
ROLE_HELP = "agent: may enqueue; operator: may resolve unknown steps; admin: both, and manage keys."
APPROVAL_HELP = (
    "Whether the key's sends wait for a person: always (every send is held until an operator or admin "
    "approves it), policy (the installation's rules: EVQ_APPROVAL_*, the budgets) or never (no rule asks "
    "a person; the budgets still cap it). Default: always for an agent key, policy for the others."
)
# bench/modes.py's MODES: the table may not import a tool (docs/design.md, "Layout and dependency direction");
# tests/unit/test_commands.py checks the two agree.
BENCH_MODES = ("drain", "latency", "enqueue", "pickup", "scale", "ceiling", "peer", "ops-pages", "retention")

# Why a command has no HTTP route or MCP tool (Command.local_only).
_PROCESS = "it runs a process on this machine (or for as long as it runs); a request cannot start or hold one"
_DATABASE = "it needs the database's own credentials, not an API key, so it is run where the database is"

# STEP_ID of the commands that act on one step.
_STEP_ID = Param("step_id", Kind.ARGUMENT, type="integer", required=True, minimum=1, maximum=MAX_ID, example=1)

_TABLE: tuple[Command, ...] = (
    Command(
        "admin.health",
        "Check that evq can do its work now: the first call before writing.",
        "Check that evq can do its work now: the database answers, its schema is this "
        "evq's, a worker was seen in the last 30 s (workers leave a heartbeat every 5 s), "
        "the /metrics queue gauges can be read, and no provider's circuit is held open. "
        "Every check is listed with ok and a detail. Exit 0 when healthy; otherwise the "
        "answer's status is partial_failure and the exit code is the first failed "
        "check's: 9 (database), 5 (schema) or 6 (the others).",
        Effect.READ,
        (OUTPUT, DATABASE_URL),
        examples=("evq admin health -o json && evq steps enqueue ...",),
        use_when="first, before an agent writes: can evq take and send work right now?",
        avoid_when="asking about one send: `steps show` has its state",
        http=(Route("GET", "/v1/health"),),
        mcp=True,
    ),
    Command(
        "admin.bench",
        "Run the benchmark and print every figure with its ratios to the raw SQL ceiling and to the peers.",
        "Run the benchmark and print every figure (median, min-max over runs) with its "
        "ratios to the raw SQL ceiling and to the peers (pgqueuer, bare and with evidence rows; DBOS Transact), measured in the same run.\n\n"
        "It creates scratch databases on the server of --database-url (it needs CREATE "
        "DATABASE) and drops them afterwards; it never touches the evq database itself. "
        "Progress goes to stderr.",
        Effect.WRITE,
        (
            Param("quick", Kind.FLAG, help="CI-sized: every mode in well under a minute, one run each."),
            Param(
                "steps",
                type="integer",
                help="Steps per drain (default 20,000; --quick 2,000); for --mode ops-pages, the steps in "
                "its database (default 1,000,000; --quick 3,000).",
            ),
            Param("runs", type="integer", minimum=1, help="Repeats of every figure (default 3; --quick 1)."),
            Param(
                "repeat",
                type="integer",
                minimum=1,
                help="--mode ops-pages: reads of each page after 2 warm-ups (default 20; --quick 2).",
            ),
            Param(
                "modes",
                flags=("--mode",),
                repeatable=True,
                enum=BENCH_MODES,
                help="Run only this mode; repeatable (default: all but ops-pages and retention, which run only when named).",
            ),
            Param(
                "scale_rows",
                type="integer",
                help="Terminal rows for the scale mode (default 1,000,000); for --mode retention, the evidence "
                "rows it fills (default 10,000,000; --quick 30,000).",
            ),
            Param(
                "processes",
                metavar="1,2",
                example="1,2",
                help="Worker processes for the drain mode, comma-separated (default 1,2).",
            ),
            Param(
                "peer",
                enum=("auto", "on", "off"),
                default="auto",
                show_default=True,
                help="Measure the peers (the 'bench' extra: pgqueuer, bare and with evidence rows; DBOS Transact): "
                "auto = those installed; on = all, or an error.",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        examples=(
            "evq admin bench                  # every mode, 3 runs each: a few minutes",
            "evq admin bench --quick -o json  # CI-sized",
            "evq admin bench --mode ops-pages # every /ops page's server time at 1,000,000 steps",
            "evq admin bench --mode retention # evq prune by whole partitions at 10,000,000 evidence rows",
        ),
        aliases=("bench",),
        use_when="measuring evq's throughput and latency on this machine, before sizing a deployment",
        avoid_when="on a production database server under load: it creates and fills scratch databases there",
        local_only=_PROCESS,
    ),
    Command(
        "admin.db-version",
        "Show the database's schema revision and the one this evq needs.",
        "Show the database's schema revision and the one this evq needs (E_SCHEMA_MISMATCH, exit 5, if they differ).",
        Effect.READ,
        (OUTPUT, DATABASE_URL),
        aliases=("db status",),
        use_when="checking that the database is at this evq's schema before starting workers or servers",
        avoid_when="checking a running installation's health as a whole",
        local_only=_DATABASE,
    ),
    Command(
        "admin.db-upgrade",
        "Migrate the database to this evq's schema.",
        "Migrate the database to this evq's schema. Safe to run again; run it before "
        "starting workers of a new evq version. It needs the database's own credentials, "
        "not an API key (it runs before any key can exist), and must connect as the role "
        "that owns evq's tables: a role that does not is refused (E_AUTH_FAILED) before "
        "anything runs. Roles that were granted the runtime privileges get them again, "
        "so a table a new revision adds reaches them. A database evq 0.2.0 made is copied once "
        "into this schema, in one transaction (stop its workers first); one a development "
        "version between 0.2.0 and 1.0 made is refused unchanged (E_SCHEMA_MISMATCH).",
        Effect.WRITE,
        (
            Param(
                "runtime_role",
                metavar="ROLE",
                help="Also grant this existing role exactly what workers, `evq admin serve` and `evq admin mcp` "
                "need (no ownership, no DDL, no UPDATE or DELETE of history). Every later upgrade grants it again.",
            ),
            DRY_RUN,
            OUTPUT,
            DATABASE_URL,
        ),
        examples=("evq admin db-upgrade --runtime-role evq_app   # as the owner, e.g. postgresql://evq_owner@db/evq",),
        aliases=("db upgrade",),
        use_when="installing evq, or after upgrading it, as the role that owns evq's tables",
        avoid_when="as the runtime role workers use: it is refused, and should be",
        risk=Risk.MEDIUM,
        confirm=True,
        local_only=_DATABASE,
    ),
    Command(
        "admin.demo",
        "Show evq end to end on this machine, on its own database and loopback servers.",
        "Show evq end to end on this machine: starts the database (embedded unless "
        "EVQ_DATABASE_URL names one), an SMTP server and a Resend-style HTTP API on loopback, "
        "enqueues six sends — two whose reply is lost (one per provider), one the server "
        "refuses — runs the worker until the queue is drained, and explains what happened: "
        "the reconciler settles the lost HTTP reply, the SMTP one waits for an operator, "
        "and the refused send's sender gets a failure notice.",
        # It sends, but only to the servers it starts on loopback.
        Effect.WRITE,
        (
            Param(
                "data_dir",
                help="Folder for the embedded PostgreSQL (default: the user data folder, e.g. ~/.local/share/evq).",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        aliases=("demo",),
        use_when="seeing what evq does, on a machine with no evq set up",
        avoid_when="on a database that holds real steps: it refuses one that holds steps that are not its own",
        local_only=_PROCESS,
    ),
    Command(
        "deliveries.list",
        "List delivery events from providers' webhooks, newest first; --unmatched for those no step claimed.",
        "List delivery events from providers' webhooks (delivered, deferred, bounced_hard, bounced_soft, "
        "complained, opened, clicked), newest first: of one step (--step), of one provider, or those that "
        "matched no step (--unmatched: kept for an operator, never dropped). Each names the step it matched "
        "by the key digest or Message-ID it echoed. Page back with --since set to meta.next_cursor.\n\n"
        "An agent key reads only the events of a step it enqueued (--step); every other view is an "
        "operator's or admin's (or the command line's without a key).",
        Effect.READ,
        (
            Param("unmatched", Kind.FLAG, help="Only events that matched no step."),
            Param(
                "step",
                type="integer",
                minimum=1,
                maximum=MAX_ID,
                metavar="ID",
                help="Only events of this step (its evq id).",
            ),
            Param("provider", metavar="P", help="Only events from this provider's webhook (resend, sendgrid, ...)."),
            Param(
                "since",
                type="integer",
                minimum=1,
                maximum=MAX_ID,
                metavar="CURSOR",
                help="The next page: events older than this one (the last page's meta.next_cursor).",
            ),
            *_page("Events"),
            OUTPUT,
            DATABASE_URL,
        ),
        examples=("evq deliveries list --unmatched -o json", "evq deliveries list --step 42"),
        use_when="a webhook event matched no step, or checking what a provider said about a message",
        avoid_when="one step's state: `steps show` gives its delivery state and events",
        http=(Route("GET", "/v1/deliveries"),),
        mcp=True,
    ),
    Command(
        "events.list",
        "List a key's events (rejections, unknowns, operator verdicts on the sends it enqueued) after a cursor.",
        "List the events of the API key's own sends after a cursor, oldest first: every "
        "rejection, every step that became unknown, and every operator verdict, whatever "
        "notices are configured. Poll with --since set to the last call's meta.next_cursor "
        "(an event id; 0: from the start).\n\n"
        "An operator or admin key (or the command line without a key) reads another key's "
        "feed with --key NAME, or every key's with --all-keys.",
        Effect.READ,
        (
            Param(
                "since",
                type="integer",
                minimum=0,
                maximum=MAX_ID,
                default=0,
                show_default=True,
                metavar="CURSOR",
                help="Only events after this one (the last call's meta.next_cursor).",
            ),
            *_page("Events", default=100, maximum=EVENTS_LIMIT_MAX),
            Param("key", metavar="NAME", help="Another key's feed, by its name (operator or admin)."),
            Param(
                "all_keys", Kind.FLAG, help="Every key's feed, and steps enqueued without a key (operator or admin)."
            ),
            Param(
                CREDENTIAL,
                flags=("--api-key",),
                env=API_KEY_ENV,
                local=True,
                metavar="KEY",
                help=f"The key whose feed to read [env: {API_KEY_ENV}].",
                # A feed is per key: without one, the command line must name whose (or every key's).
                unless=("key", "all_keys"),
                unless_env=API_KEY_ENV,
                required_text=f"required unless --key or --all-keys is given or {API_KEY_ENV} is set",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.READ,
        examples=("evq events list --since 0 -o json", "evq events list --key agent-7 --since 1200"),
        use_when="an agent catching up on what went wrong with its sends since its last look (poll with the cursor)",
        avoid_when="following one send you are waiting on: `steps show` answers at once",
        http=(Route("GET", "/v1/events"),),
        mcp=True,
    ),
    Command(
        "keys.create",
        "Create an API key and print it once (only its hash is stored).",
        "Create an API key and print it once (only its hash is stored).\n\n"
        "The first key of a fresh install is an admin key and needs no key itself: "
        "`evq keys create --name NAME --role admin`. Every later one needs an admin key.\n\n"
        "An agent key's sends wait for a person unless --approval says otherwise. Its failures "
        "always reach its event feed (`evq events list`); give --notify-email or --notify-url for "
        "them to reach an inbox or a callback too (the answer says where they go).",
        Effect.WRITE,
        (
            Param(
                "name",
                required=True,
                example="ops-bob",
                help="Who holds the key; recorded as the actor in evidence. Never reused.",
            ),
            Param("role", required=True, enum=tuple(r.value for r in Role), help=ROLE_HELP),
            Param("approval", enum=tuple(a.value for a in KeyApproval), help=APPROVAL_HELP),
            Param("notify_email", metavar="ADDR", help=NOTIFY_EMAIL_HELP),
            Param("notify_url", metavar="URL", help=NOTIFY_URL_HELP),
            DRY_RUN,
            replace(
                api_key(Permission.MANAGE_KEYS),
                required_text=f"required unless --dry-run is given, {API_KEY_ENV} is set, or no admin key "
                "exists yet (the first key, an admin key, needs none)",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.MANAGE_KEYS,
        examples=(
            "evq keys create --name agent-7 --role agent --notify-email agent-7-inbox@example.org",
            "evq keys create --name mailer --role agent --approval never --notify-url https://hooks.example.org/evq",
        ),
        use_when="giving an agent, an operator or a service its own key (one per holder: evidence names it)",
        avoid_when="sharing one key between holders: revoke and create instead",
        risk=Risk.MEDIUM,
        local_only="keys are managed where the database is, by an administrator; no request can mint a key",
    ),
    Command(
        "keys.list",
        "List API keys (names, roles, prefixes, approval; never the keys), oldest first.",
        "List API keys (names, roles, prefixes; never the keys), oldest first, each with whether its "
        "sends wait for a person (approval: always, policy or never) and where its failures go.",
        Effect.READ,
        (
            Param(
                "limit",
                type="integer",
                minimum=1,
                maximum=1000,
                default=100,
                show_default=True,
                help="Keys per page.",
            ),
            Param("offset", type="integer", minimum=0, default=0, show_default=True, help="Keys to skip."),
            OUTPUT,
            DATABASE_URL,
        ),
        use_when="auditing who holds a key, and which are revoked",
        avoid_when="looking for a key's secret: it is never stored, only shown once by `evq keys create`",
        local_only="keys are managed where the database is, by an administrator",
    ),
    Command(
        "keys.revoke",
        "Revoke a key; it is refused from the next command on.",
        "Revoke a key; it is refused from the next command on. Revoking a revoked "
        "key changes nothing; the last active admin key cannot be revoked (exit 3).",
        Effect.WRITE,
        (
            Param("name", Kind.ARGUMENT, required=True, example="ops-bob"),
            DRY_RUN,
            api_key(Permission.MANAGE_KEYS),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.MANAGE_KEYS,
        use_when="a key leaked, or its holder no longer needs it",
        avoid_when="pausing a holder for a while: a revoked key never works again",
        risk=Risk.HIGH,
        confirm=True,
        local_only="keys are managed where the database is, by an administrator",
    ),
    Command(
        "keys.update",
        "Change whether a key's sends wait for a person, and its default notification targets.",
        "Change whether the key's sends wait for a person (--approval: always, policy or never; "
        "from its next enqueue on), and its default notification targets: the address told of a "
        "failure of a send the key enqueued when the request named no notify address, and the URL "
        "evq POSTs each of its events to, signed (the secret is printed when a URL is set). The "
        "key itself is unchanged. Its event feed (`evq events list`) gets every event either way.",
        Effect.WRITE,
        (
            Param("name", Kind.ARGUMENT, required=True),
            Param(
                "notify_email",
                metavar="ADDR",
                help=NOTIFY_EMAIL_HELP,
                example="agent-inbox@example.org",
                # Something must change: this, or one of the other changes.
                unless=("clear_notify_email", "notify_url", "clear_notify_url", "rotate_callback_secret", "approval"),
                required_text="one change is needed: this, --clear-notify-email, --notify-url, "
                "--clear-notify-url, --rotate-callback-secret or --approval",
            ),
            Param("clear_notify_email", Kind.FLAG, help="Remove the key's default notification address."),
            Param("notify_url", metavar="URL", help=NOTIFY_URL_HELP),
            Param("clear_notify_url", Kind.FLAG, help="Remove the key's callback URL (no more callbacks)."),
            Param(
                "rotate_callback_secret",
                Kind.FLAG,
                help="A new signing secret for the callbacks (printed once); the old one stops verifying.",
            ),
            Param("approval", enum=tuple(a.value for a in KeyApproval), help=APPROVAL_HELP.split(" Default:")[0]),
            DRY_RUN,
            api_key(Permission.MANAGE_KEYS),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.MANAGE_KEYS,
        examples=(
            "evq keys update agent-7 --notify-email agent-7-inbox@example.org",
            "evq keys update mailer --approval never",
        ),
        use_when="letting a key send without a person (or making it wait for one), pointing a key's failures "
        "at an inbox or a callback URL, or rotating the callback's secret",
        avoid_when="changing what a key may do: revoke it and create another",
        risk=Risk.MEDIUM,
        local_only="keys are managed where the database is, by an administrator; no request can change a key",
    ),
    Command(
        "admin.mcp",
        "Serve evq's commands as MCP tools over stdio (for an agent's MCP client).",
        "Serve evq's commands as MCP tools over stdio (for an agent's MCP client), one tool per "
        "command, named evq_<group>_<action> after it: evq_admin_health (call it first), evq_steps_enqueue, evq_steps_show, "
        "evq_steps_list, evq_runs_show, evq_providers_list, evq_policy_show, evq_events_list, evq_deliveries_list, "
        "evq_steps_wait, evq_steps_cancel, evq_steps_approve and evq_steps_deny with EVQ_MCP_TOOLS=approve (operator or "
        "admin keys only, never the key that enqueued the send), and evq_steps_resolve with EVQ_MCP_TOOLS=resolve "
        "(these dry-run unless told not to).\n\n"
        "The API key comes from EVQ_API_KEY in the server's environment, never from a "
        "tool's arguments; every call is checked with it (reads: any role). stdout is "
        "the protocol's: logs go to stderr, and -o json prints only an error at startup.",
        # Its tools enqueue (and, with EVQ_MCP_TOOLS=resolve, resolve); the worker sends.
        Effect.WRITE,
        (OUTPUT, DATABASE_URL),
        examples=("EVQ_API_KEY=evq_... evq admin mcp",),
        aliases=("mcp",),
        use_when="an MCP client starts it, to give an agent evq's tools",
        avoid_when="running by hand: it speaks the MCP protocol on stdin and stdout",
        risk=Risk.MEDIUM,
        local_only=_PROCESS,
    ),
    Command(
        "policy.show",
        "Show the approval policy and how much of each blast-radius budget the current windows used.",
        "Show the approval policy this installation enqueues under (EVQ_APPROVAL_*, EVQ_BUDGET_*): "
        "whether every send is held, the first-contact rule (off, address or domain), the recipient "
        "cap, the allowed hours and weekdays in their time zone, how long a held send waits before it "
        "expires, each budget's cap and what a send over one gets (hold or refuse); each key that may "
        "enqueue with its approval (always: every send waits for a person; policy: these rules; never: "
        "no rule asks a person, the budgets still apply; an agent key sees its own); and the budgets' "
        "counters in their current windows (a run's over its life, a key's this hour and this UTC day, "
        "a domain's this hour), most used first. A request's require_approval holds it whatever the policy.",
        Effect.READ,
        (OUTPUT, DATABASE_URL),
        use_when="before a batch: will these sends be held, and how much budget is left?",
        avoid_when="asking why one send is held: `steps show` has its hold and evidence",
        http=(Route("GET", "/v1/policy"),),
        mcp=True,
    ),
    Command(
        "providers.list",
        "List every provider: what settles a lost answer, its rate limit, its circuit and why an open one opened.",
        "List every provider a step may name: its profile (whether it dedupes our key and for how long, "
        "what a lookup finds messages by, which delivery events its configured webhook sends, and whether "
        "a send whose answer was lost could ever be settled without an operator: resolvable), its shared "
        "rate limit (EVQ_RATE_LIMIT), whether EVQ_ADAPTER names it here, and its circuit: closed (sending), "
        "open (down or misconfigured: nothing is sent, attempts are not charged, a probe goes out after the "
        "wait shown) or half_open (one probe is out). An open circuit shows why it opened.",
        Effect.READ,
        (OUTPUT, DATABASE_URL),
        use_when="sends are not going out, or before a batch: is a provider down or misconfigured, "
        "and can it settle a lost answer?",
        avoid_when="asking about one send: `steps show` has its own state and evidence",
        http=(Route("GET", "/v1/providers"),),
        mcp=True,
    ),
    Command(
        "refusals.list",
        "List refused enqueues, newest first: what was asked, by which key, every failing field.",
        "List refused enqueues, newest first: when, through which interface (cli, http, mcp, python), "
        "the API key's name (never the key; none when no valid key was shown), every failing field "
        "with its message, and what was asked as identifiers only (run_id, step_id, provider, the "
        "field names given, the recipient count) with the SHA-256 and size of the request: the "
        "body itself is never kept. Recorded by `evq enqueue` (with EVQ_DATABASE_URL), `evq serve`, "
        "`evq mcp` and evq.enqueue_own; `evq prune` deletes old ones.",
        Effect.READ,
        (
            Param("key_name", flags=("--key",), metavar="NAME", help="Only refusals of the API key with this name."),
            Param(
                "interface", enum=("cli", "http", "mcp", "python"), help="Only refusals made through this interface."
            ),
            Param(
                "before_id",
                type="integer",
                minimum=1,
                maximum=MAX_ID,
                help="Only refusals with an id at most this (the next page: meta.next_before_id).",
            ),
            *_page("Refusals"),
            OUTPUT,
            DATABASE_URL,
        ),
        examples=("evq refusals list --key agent-7 -o json",),
        use_when="finding out what an agent tried to send and why evq refused it",
        avoid_when="looking for sends that were accepted and then failed: `steps list` has those",
        http=(Route("GET", "/v1/refusals"),),
        local_only="no MCP tool: it is an operator's view of every agent's refusals, and an agent "
        "already has its own in the error its enqueue got",
    ),
    Command(
        "steps.prune",
        "Delete accepted and rejected steps older than --older-than, with their evidence and decisions.",
        "Delete accepted and rejected steps older than --older-than, with their "
        "evidence and decisions, in batches; each batch is one transaction and one row "
        "of prune_log. Steps in flight, retryable or unknown are never deleted, nor a "
        "step whose failure notice is not yet old and terminal (it goes with its notice). "
        "Refused enqueues recorded before the same cutoff go too (their counts stay), "
        "then the approval policy's budget counters whose window closed before it. "
        "\"Older\" is measured on the database's clock, never this machine's. "
        "Needs an API key with role admin (not for --dry-run, which only counts).\n\n"
        "Progress goes to stderr. Ctrl-C is safe: finished batches stay done and "
        "logged, the batch in progress is rolled back.",
        Effect.WRITE,
        (
            Param(
                "older_than",
                required=True,
                metavar="90d",
                example="90d",
                help="Delete terminal steps created and closed longer ago than this, by the database's clock. "
                f"Units: {RETENTION_HELP}. `m` is refused as ambiguous (write min or mo).",
            ),
            Param(
                "batch_size",
                type="integer",
                default=1000,
                show_default=True,
                help="Steps deleted per transaction.",
            ),
            DRY_RUN,
            api_key(Permission.PRUNE),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.PRUNE,
        examples=("evq steps prune --older-than 90d --dry-run", "evq steps prune --older-than 90d -o json"),
        aliases=("prune",),
        use_when="applying the retention policy: closed steps older than it go, with their evidence",
        avoid_when="anything might still need the proof of those sends: what it deletes is gone for good",
        risk=Risk.HIGH,
        confirm=True,
        local_only="it deletes evidence for good, in long batches: an administrator runs it where the database is",
    ),
    Command(
        "runs.show",
        "Show one run's chain in time order, a page of its steps at a time.",
        "Show one run's chain in time order, a page of its steps at a time (in step id "
        "order): each decision (intent, instruction and prompt version, model, tool), its "
        "action, every attempt with the adapter's answer, and every operator close. "
        "meta.total counts the run's steps; --offset reads the next page.",
        Effect.READ,
        (Param("run_id", Kind.ARGUMENT, required=True, example="r1"), *_page("Steps"), OUTPUT, DATABASE_URL),
        use_when="auditing what an agent run decided and what happened to each of its sends",
        avoid_when="following one send: `steps show` is shorter",
        http=(Route("GET", "/v1/runs/{run_id}"),),
        mcp=True,
    ),
    Command(
        "schema.show",
        "Describe evq's commands for scripts and agents, a level at a time.",
        "Describe evq's commands for scripts and agents: the products, evq's command groups "
        "(`evq schema`, or `evq schema list`), a product's tools (`evq schema steps`), one tool's "
        "parameters and the JSON Schema of its output (`evq schema steps.resolve`, `evq schema steps "
        'resolve`, `evq schema --cli-path "steps resolve"`, an alias such as `evq schema enqueue` '
        "too), or everything (`evq schema --all`). The overview's agent_metadata.surface_hash changes "
        "whenever anything described changes: an agent caches what it read under it.",
        Effect.READ,
        (
            Param("name", Kind.ARGUMENT, repeatable=True, example="steps.resolve"),
            Param(
                "cli_path",
                metavar="WORDS",
                example="steps resolve",
                help="One tool by its command line after `evq`, as typed (`steps resolve`, or an alias such as "
                "`enqueue`): the same answer as NAME, which it replaces.",
            ),
            Param(
                "everything",
                Kind.FLAG,
                flags=("--all",),
                help="Every product with every tool, its parameters and output schema.",
            ),
            OUTPUT,
        ),
        examples=(
            "evq schema -o json",
            "evq schema steps -o json",
            "evq schema steps.resolve -o json      (or: evq schema steps resolve)",
            'evq schema --cli-path "steps resolve" -o json',
        ),
        # `evq schema steps` takes the name as an argument, so `schema` cannot be a group of its own.
        cli="schema",
        use_when="before calling a command: what it takes, what it prints, what it may change",
        avoid_when="never: it reads nothing but evq itself",
        local_only="it describes this evq's own commands; an HTTP client reads /openapi.json, an MCP client tools/list",
    ),
    Command(
        "admin.serve",
        "Serve the HTTP API, the operators' page, /metrics and /healthz.",
        "Serve the HTTP API (/v1, described at /openapi.json), the operators' page (/ops), "
        "/metrics and /healthz until SIGTERM or Ctrl-C.\n\n"
        "Every /v1 route needs `Authorization: Bearer <key>`; the page asks for a key at "
        "sign-in. It listens on 127.0.0.1 unless told otherwise: put TLS in front of it "
        "before you open it to a network.",
        # Its routes enqueue and resolve; the worker sends.
        Effect.WRITE,
        (
            Param(
                "host",
                env="EVQ_SERVE_HOST",
                default="127.0.0.1",
                setting=True,
                metavar="ADDR",
                example="127.0.0.1",
                help="Address to listen on [env: EVQ_SERVE_HOST; default: 127.0.0.1].",
            ),
            Param(
                "port",
                type="integer",
                minimum=0,
                maximum=65535,
                default=8080,
                setting=True,
                example=0,
                help="Port to listen on; 0: any free one [default: 8080].",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        examples=("evq admin serve --host 127.0.0.1 --port 8080",),
        aliases=("serve",),
        use_when="giving agents and operators the HTTP API and the operators' page",
        avoid_when="on a public address without TLS in front of it",
        risk=Risk.MEDIUM,
        local_only=_PROCESS,
    ),
    Command(
        "steps.enqueue",
        "Enqueue an email send.",
        "Enqueue an email send. Repeating the same request returns the same step "
        "(created: false); the same key with a different request (another payload or provider) is refused (exit 3). "
        "Needs an API key with role agent or admin.",
        # The worker does the sending, but an enqueued step is a send decided: nothing
        # after it asks anyone, so for an agent deciding whether to ask first this is the send.
        Effect.SEND,
        (
            *_send_request(),
            Param(
                "file",
                metavar="F",
                local=True,
                example="request.json",
                help="Read the request as JSON from F ('-' for stdin). JSON Lines (one request per line) enqueue "
                "many in one transaction. At most EVQ_MAX_INPUT_BYTES are read.",
            ),
            DRY_RUN,
            api_key(Permission.ENQUEUE),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.ENQUEUE,
        examples=(
            "evq steps enqueue --run-id r1 --step-id welcome --to bob@example.com \\",
            '    --from agent@example.org --subject Hello --text "Hi Bob" --intent "welcome Bob"',
            "evq steps enqueue --file request.json -o json",
        ),
        idempotent=True,  # the same request again returns the same step
        aliases=("enqueue",),
        use_when="an agent decided to send an email: record it once, with the decision behind it",
        avoid_when="sending again a step that is `unknown`: it may have been delivered; an operator decides",
        risk=Risk.MEDIUM,
        http=(Route("POST", "/v1/steps"),),
        mcp=True,
    ),
    Command(
        "steps.list",
        "List steps: unknown ones oldest first, the rest newest first.",
        "List steps: unknown ones oldest first (the operator's queue), the rest newest "
        "first, each with its age (unknown rows: since they became unknown).",
        Effect.READ,
        (
            Param(
                "statuses",
                flags=("--status",),
                repeatable=True,
                enum=tuple(s.value for s in Status),
                help="Only these states; repeatable.",
            ),
            *_filters(),
            *_page("Rows"),
            OUTPUT,
            DATABASE_URL,
        ),
        use_when="finding steps by state, run, provider, age or recipient domain; the unknown ones to close",
        avoid_when="reading one step's evidence: `steps show`",
        http=(Route("GET", "/v1/steps"),),
        mcp=True,
    ),
    Command(
        "steps.resolve",
        "Close unknown steps with an audited verdict: one by STEP_ID, or many with --status unknown and filters.",
        "Close unknown steps with an audited verdict: one by STEP_ID, or many with "
        "--status unknown and filters. Only unknown rows can be resolved (exit 3 otherwise).\n\n"
        "Each close and its evidence row (you, your note, reason and references, and "
        "the state it replaced) are written together. In bulk, the filters are fixed "
        "when the command starts and each row is closed on its own: some may fail "
        "(someone else closed them first) while the rest succeed (exit 6). The first "
        "Ctrl-C stops after the current row (exit 7).",
        Effect.WRITE,
        (
            Param(
                "step_id",
                Kind.ARGUMENT,
                type="integer",
                minimum=1,
                maximum=MAX_ID,
                unless=("statuses",),
                required_text="one row: STEP_ID; many: --status unknown (with filters) instead",
                example=1,
            ),
            Param(
                "verdict",
                flags=("--as",),
                required=True,
                enum=tuple(v.value for v in Verdict),
                help="accepted / rejected: close the row; retry: verified not sent, send again (same key, same "
                "Message-ID).",
            ),
            Param(
                "note",
                required=True,
                example="found in the provider's log",
                help="Why: what was checked and what was found (kept in the evidence).",
            ),
            Param(
                "reason",
                metavar="CODE",
                example="found_in_provider_log",
                help="A machine key for the verdict, e.g. found_in_provider_log.",
            ),
            Param("provider_message_id", metavar="ID", help="The provider's id for the message, when found."),
            Param("evidence_url", metavar="URL", help="Where the proof is (a log search, a ticket)."),
            Param(
                "statuses",
                flags=("--status",),
                repeatable=True,
                enum=(Status.UNKNOWN.value,),
                unless=("step_id",),
                required_text="many rows: --status unknown; one row: STEP_ID instead",
                help="Bulk (no STEP_ID): every row in this state that matches the filters below.",
            ),
            *_filters(),
            Param(
                "limit", type="integer", minimum=1, maximum=MAX_ID, help="Bulk: at most this many rows, oldest first."
            ),
            Param(
                "max_failures",
                type="integer",
                minimum=1,
                metavar="N",
                help="Bulk: stop after N consecutive failures (exit 8).",
            ),
            DRY_RUN,
            api_key(Permission.RESOLVE),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.RESOLVE,
        examples=(
            'evq steps resolve 42 --as accepted --note "in the provider log" --provider-message-id q-123',
            "evq steps resolve --status unknown --older-than 2h --as rejected --note "
            '"outage, resent by hand" --dry-run',
        ),
        use_when="an operator checked the provider's logs or the mailbox for an unknown step's Message-ID",
        avoid_when="nobody checked: `retry` on a send that was delivered sends it twice",
        risk=Risk.HIGH,
        confirm=True,
        http=(Route("POST", "/v1/steps/resolve"), Route("POST", "/v1/steps/{step_id}/resolve", "by_step_id")),
        mcp=True,
    ),
    Command(
        "steps.approve",
        "Approve a held send: it becomes pending with the same key and Message-ID, and a worker sends it.",
        "Approve a held send: it becomes pending with the same key and Message-ID, and a "
        "worker sends it (at its send_at, if later). Only a held step can be approved "
        "(exit 3 otherwise); an agent key never can, nor the key that enqueued it (exit 4).\n\n"
        "--subject, --text and --html correct the message before it goes: a new request, "
        "validated as an enqueue is, with a new hash; the agent's hash is kept "
        "(requested_sha256), its retry still finds the step, and the evidence shows both. "
        "--drop-html (or an empty --html) removes the HTML part. A corrected --text of a send "
        "that has an HTML part is refused (exit 2) unless --html or --drop-html says what "
        "becomes of it: most mail clients show the HTML, not the text. "
        "The recipients become known to the sender (the first-contact rule).",
        Effect.SEND,
        (
            _STEP_ID,
            Param(
                "note",
                required=True,
                example="checked with the account owner",
                help="Why: what you checked (kept in the evidence with your key's name).",
            ),
            Param("subject", metavar="TEXT", help="Correct the subject before it is sent."),
            Param("text", metavar="TEXT", help="Correct the plain-text body before it is sent."),
            Param("html", metavar="HTML", help="Correct the HTML body before it is sent (empty: remove it)."),
            Param(
                "drop_html",
                Kind.FLAG,
                help="Remove the HTML part (a corrected --text needs this or --html when there is one).",
            ),
            DRY_RUN,
            api_key(Permission.APPROVE),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.APPROVE,
        examples=(
            'evq steps approve 42 --note "checked with the account owner" --dry-run',
            'evq steps approve 42 --note "fixed the greeting" --subject "Your invoice"',
            'evq steps approve 42 --note "wrong date" --text "See you on Monday" --drop-html',
        ),
        use_when="a person read a held send (`steps list --status held`, `steps show`) and it should go out",
        avoid_when="you asked for it: an agent key, and the key that enqueued it, never approve; wait, or cancel it",
        risk=Risk.HIGH,
        confirm=True,
        http=(Route("POST", "/v1/steps/{step_id}/approve"),),
        mcp=True,
    ),
    Command(
        "steps.deny",
        "Deny a held send: it is closed rejected (reason denied), never sent, and a known notify is told.",
        "Deny a held send: it is closed rejected (reason denied), never sent, and its "
        "notify address is told if its sender is known to mail it (known_recipients: a stranger "
        "the hold was waiting on is never mailed on the agent's word; the key's event feed has "
        "the rejection either way). Only a held step can be denied (exit 3 otherwise); an "
        "agent key never can (exit 4).",
        Effect.WRITE,
        (
            _STEP_ID,
            Param(
                "note",
                required=True,
                example="not to this customer",
                help="Why (kept in the evidence, and the agent's feed shows it).",
            ),
            DRY_RUN,
            api_key(Permission.APPROVE),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.APPROVE,
        examples=('evq steps deny 42 --note "not to this customer"',),
        use_when="a person read a held send and it must not go out",
        avoid_when="the message only needs a correction: `steps approve` with --subject/--text/--html",
        risk=Risk.HIGH,
        confirm=True,
        http=(Route("POST", "/v1/steps/{step_id}/deny"),),
        mcp=True,
    ),
    Command(
        "steps.cancel",
        "Cancel a send not yet sent (held, pending, or retryable that cannot have gone out): it is never sent.",
        "Cancel a send not yet sent (held, pending, or retryable that cannot have gone "
        "out): it is closed rejected (reason cancelled) and never sent. The key that "
        "enqueued it may cancel it, and any operator or admin key. A step a worker is "
        "sending (in_flight) cannot be cancelled, nor one that may have been delivered "
        "(exit 3: an operator resolves that with `steps resolve`).",
        Effect.WRITE,
        (
            _STEP_ID,
            Param("note", example="the customer replied first", help="Why (kept in the evidence)."),
            DRY_RUN,
            api_key(Permission.CANCEL),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.CANCEL,
        examples=('evq steps cancel 42 --note "the customer replied first"',),
        use_when="a queued, scheduled or held send should not go out after all",
        avoid_when="the step is unknown or in flight: it may already be delivered; `steps show` says what to do",
        risk=Risk.HIGH,
        confirm=True,
        http=(Route("POST", "/v1/steps/{step_id}/cancel"),),
        mcp=True,
    ),
    Command(
        "steps.show",
        "Show one step: the decision behind it, the request, and every evidence row in order.",
        "Show one step: the decision behind it, the request, and every evidence row in order.\n\n"
        "The message's text and html are shown only with an API key whose role sees content "
        f"({' or '.join(str(r) for r in ALLOWED[Permission.READ_CONTENT])}); otherwise, and once "
        "retention (EVQ_KEEP_CONTENT) removed them, step.content gives each part's size and "
        "SHA-256 and says why it is not shown.\n\n"
        "step.safe_to_retry and step.next_action say what may be done next (`evq schema steps.wait` lists "
        "every next_action); `steps wait` answers when it is worth acting on.",
        Effect.READ,
        (
            Param("step_id", Kind.ARGUMENT, type="integer", required=True, minimum=1, maximum=MAX_ID, example=1),
            CONTENT_KEY,
            OUTPUT,
            DATABASE_URL,
        ),
        use_when="following one send: its state, the decision behind it and every attempt",
        avoid_when="searching for steps: `steps list`",
        http=(Route("GET", "/v1/steps/{step_id}"),),
        mcp=True,
    ),
    Command(
        "steps.wait",
        "Wait until a step is worth acting on, then show it (at most a minute).",
        "Wait until a step is worth acting on, then show it as `steps show` does: as soon as its "
        "next_action is neither `wait` nor `wait_for_approval` (sent, rejected, denied, or an operator is "
        "needed; a held step until a person decides, and an approved one until it is sent), or at "
        "--timeout with meta.timed_out true (call again). next_action is one of: "
        + "; ".join(f"{name}: {meaning}" for name, meaning in NEXT_ACTIONS.items())
        + ".\n\nOver HTTP it is `GET /v1/steps/{step_id}?wait=30s` (steps show's route).",
        Effect.READ,
        (
            Param("step_id", Kind.ARGUMENT, type="integer", required=True, minimum=1, maximum=MAX_ID, example=1),
            Param(
                "timeout",
                metavar="30s|1m|500ms",
                default=WAIT_DEFAULT,
                show_default=True,
                help="How long to wait at most (at most 60s); the view is answered then, with meta.timed_out.",
                example="2s",
            ),
            CONTENT_KEY,
            OUTPUT,
            DATABASE_URL,
        ),
        use_when="after an enqueue, instead of polling `steps show`: it answers when the step is sent, "
        "refused, held or needs an operator",
        avoid_when="following many steps at once: `events list` is the feed of every failure",
        mcp=True,
        local_only="over HTTP it is steps show's route with a query parameter, GET /v1/steps/{step_id}?wait=30s",
    ),
    Command(
        "worker.run",
        "Claim queued sends, send them through the adapter, record every outcome.",
        "Claim queued sends, send them through the adapter, record every outcome.\n\n"
        "The first SIGTERM or Ctrl-C stops claiming, hands back claimed rows not yet "
        "sent, and waits up to --shutdown-grace for sends in flight; a second one exits "
        "130 at once (rows in flight are then left to the rescuer, as after a crash).",
        Effect.SEND,
        (
            # Every setting is a flag here and an EVQ_* variable everywhere.
            *(_setting(option) for option in OPTIONS),
            Param(
                "drain",
                Kind.FLAG,
                help="Stop once nothing is claimable now and nothing is in flight, and print what was done: "
                "exit 0, or 6 (E_PARTIAL_FAILURE) when every attempt failed before any provider could act "
                "(nothing listens, a refused login): a drain that delivered nothing is no success.",
            ),
            OUTPUT,
        ),
        use_when="running the installation: workers are what send queued email",
        avoid_when="with a real provider configured on a test database: it sends what is queued",
        risk=Risk.HIGH,
        local_only=_PROCESS,
    ),
)

COMMANDS: dict[str, Command] = {c.path: c for c in _TABLE}
# Every command line (after `evq`) that runs a command: its own, then its aliases.
CLI_PATHS: dict[str, tuple[Command, bool]] = {
    **{c.words: (c, False) for c in _TABLE},
    **{alias: (c, True) for c in _TABLE for alias in c.aliases},
}


def command(path: str) -> Command:
    return COMMANDS[path]


def mcp_name(path: str) -> str:
    """``steps.resolve`` -> ``evq_steps_resolve``; ``admin.db-version`` -> ``evq_admin_db_version``."""
    return "evq_" + path.replace(".", "_").replace("-", "_")


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
