"""Every command, described once: the table the CLI's flags (ops/cli/table.py), `evq schema`
(ops/cli/describe.py), the HTTP API's input schemas and the MCP tools' input schemas
(ops/app/schemas.py) are all built from, so no interface can describe a parameter
differently from another.

A :class:`Command` is one leaf (``steps.resolve``): what it is for, what it may change
(:class:`Effect`), which permission its API key needs, and its :class:`Param` s in the
order ``--help`` shows them. A parameter has one flag (``--older-than``) and one JSON
property (``older_than``: the name in an HTTP body or MCP arguments). What each
command does stays in its interface (ops/cli/*.py, ops/web/api.py, ops/mcp/server.py),
and what it prints in its output schema (ops/app/cli-schema/).

Neutral: nothing here knows click, FastAPI or MCP.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from evq.ops.app.service import DECISION_FIELDS, FILTERS, HEADERS_HELP, LIST_LIMIT_MAX, MAX_ATTEMPTS_HELP, MAX_ID
from evq.ops.app.service import REQUEST_FIELDS as SEND_FIELDS
from evq.ops.settings import OPTIONS, Option
from evq.worker.circuit import FAULTS
from evq.worker.keys import ALLOWED, Permission, Role
from evq.worker.pruner import RETENTION_HELP
from evq.worker.resolution import Verdict
from evq.worker.states import Status

API_KEY_ENV = "EVQ_API_KEY"
# The parameter that carries the API key; the CLI turns it into a Credential (ops/cli/auth.py).
CREDENTIAL = "credential"


class Effect(StrEnum):
    """The most one run of a command can do, for an agent deciding whether to ask first."""

    READ = "read"  # changes nothing
    WRITE = "write"  # changes evq's rows or its database, sends nothing
    SEND = "send"  # can make email leave


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
    repeatable: bool = False
    env: str | None = None
    setting: bool = False
    local: bool = False
    metavar: str | None = None
    show_default: bool = False

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


def json_name(flag_or_dest: str) -> str:
    """``--older-than`` -> ``older_than``."""
    return flag_or_dest.lstrip("-").replace("-", "_").lower()


@dataclass(frozen=True, slots=True)
class Command:
    """One leaf command. ``path`` is its stable name (``steps.resolve``); the command line
    spells it as words (``evq steps resolve``)."""

    path: str
    summary: str
    help: str
    effect: Effect
    params: tuple[Param, ...]
    permission: Permission | None = None  # what its API key needs; None: it takes no key
    examples: tuple[str, ...] = ()

    @property
    def words(self) -> str:
        return self.path.replace(".", " ")

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
    help="PostgreSQL URL [env: EVQ_DATABASE_URL; unset: the embedded server].",
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
    )


def _filters() -> tuple[Param, ...]:
    """The filters `steps list` and bulk `steps resolve` share (ops/app/service.py's FILTERS)."""
    return tuple(Param(name, metavar=metavar, help=help_text) for name, metavar, help_text in FILTERS)


def _send_request() -> tuple[Param, ...]:
    """The send request's fields as flags: the same field table request_schema() reads."""
    fields = tuple(Param(name, repeatable=multiple, help=help_text) for name, multiple, help_text in SEND_FIELDS)
    decision = tuple(
        Param("decision_" + name, flags=("--" + name.replace("_", "-"),), help=help_text)
        for name, help_text in DECISION_FIELDS
    )
    return (
        *fields,
        *decision,
        Param("headers", flags=("--header",), repeatable=True, metavar="'NAME: VALUE'", help=HEADERS_HELP),
        Param("max_attempts", type="integer", help=MAX_ATTEMPTS_HELP),
    )


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
    "admin": "Check that evq can do its work: the database, its schema, workers, the collector, providers.",
    "db": "Create or migrate evq's tables (Alembic).",
    "keys": "Manage API keys: who may change rows, and the name evidence records them by.",
    "providers": "The email providers evq sends through, and their circuits.",
    "runs": "Read back an agent run: every step it decided, and everything that happened to each.",
    "steps": "Read back email steps (state, decision, evidence) and close unknown ones.",
    "worker": "Run the worker that sends queued email.",
}

ROLE_HELP = "agent: may enqueue; operator: may resolve unknown steps; admin: both, and manage keys."
# ops/bench/modes.py's MODES: the table may not import a tool (docs/design.md, "Layout and dependency direction");
# tests/unit/test_commands.py checks the two agree.
BENCH_MODES = ("drain", "latency", "enqueue", "pickup", "scale", "ceiling", "peer")

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
    ),
    Command(
        "bench",
        "Run the benchmark and print every figure with its ratios to the raw SQL ceiling and to pgqueuer.",
        "Run the benchmark and print every figure (median, min-max over runs) with its "
        "ratios to the raw SQL ceiling and to pgqueuer, measured in the same run.\n\n"
        "It creates scratch databases on the server of --database-url (it needs CREATE "
        "DATABASE) and drops them afterwards; it never touches the evq database itself. "
        "Progress goes to stderr.",
        Effect.WRITE,
        (
            Param("quick", Kind.FLAG, help="CI-sized: every mode in well under a minute, one run each."),
            Param("steps", type="integer", help="Steps per drain (default 20,000; --quick 2,000)."),
            Param("runs", type="integer", minimum=1, help="Repeats of every figure (default 3; --quick 1)."),
            Param(
                "modes",
                flags=("--mode",),
                repeatable=True,
                enum=BENCH_MODES,
                help="Run only this mode; repeatable (default: all).",
            ),
            Param("scale_rows", type="integer", help="Terminal rows for the scale mode (default 1,000,000)."),
            Param(
                "processes",
                metavar="1,2",
                help="Worker processes for the drain mode, comma-separated (default 1,2).",
            ),
            Param(
                "peer",
                enum=("auto", "on", "off"),
                default="auto",
                show_default=True,
                help="Measure pgqueuer (the 'bench' extra): auto = when installed.",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        examples=(
            "evq bench                  # every mode, 3 runs each: a few minutes",
            "evq bench --quick -o json  # CI-sized",
        ),
    ),
    Command(
        "db.status",
        "Show the database's schema revision and the one this evq needs.",
        "Show the database's schema revision and the one this evq needs (E_SCHEMA_MISMATCH, exit 5, if they differ).",
        Effect.READ,
        (OUTPUT, DATABASE_URL),
    ),
    Command(
        "db.upgrade",
        "Migrate the database to this evq's schema.",
        "Migrate the database to this evq's schema. Safe to run again; run it before "
        "starting workers of a new evq version. It needs the database's own credentials, "
        "not an API key (it runs before any key can exist), and must connect as the role "
        "that owns evq's tables: a role that does not is refused (E_AUTH_FAILED) before "
        "anything runs. Roles that were granted the runtime privileges get them again, "
        "so a table a new revision adds reaches them.",
        Effect.WRITE,
        (
            Param(
                "runtime_role",
                metavar="ROLE",
                help="Also grant this existing role exactly what workers, `evq serve` and `evq mcp` need (no "
                "ownership, no DDL, no UPDATE or DELETE of history). Every later upgrade grants it again.",
            ),
            DRY_RUN,
            OUTPUT,
            DATABASE_URL,
        ),
        examples=("evq db upgrade --runtime-role evq_app   # as the owner, e.g. postgresql://evq_owner@db/evq",),
    ),
    Command(
        "demo",
        "Show evq end to end on this machine, on its own database and loopback servers.",
        "Show evq end to end on this machine: starts the database (embedded unless "
        "EVQ_DATABASE_URL is set), an SMTP server and a Resend-style HTTP API on loopback, "
        "enqueues six sends — two whose reply is lost (one per provider), one the server "
        "refuses — runs the worker until the queue is drained, and explains what happened: "
        "the reconciler settles the lost HTTP reply, the SMTP one waits for an operator, "
        "and the refused send's sender gets a failure notice.",
        # It sends, but only to the servers it starts on loopback.
        Effect.WRITE,
        (
            Param(
                "data_dir",
                env="EVQ_DATA_DIR",
                setting=True,
                help="Folder for the embedded PostgreSQL [env: EVQ_DATA_DIR].",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
    ),
    Command(
        "enqueue",
        "Enqueue an email send.",
        "Enqueue an email send. Repeating the same request returns the same step "
        "(created: false); the same key with a different request is refused (exit 3). "
        "Needs an API key with role agent or admin.",
        # It records the send; the worker is what sends it.
        Effect.WRITE,
        (
            *_send_request(),
            Param(
                "file",
                metavar="F",
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
            "evq enqueue --run-id r1 --step-id welcome --to bob@example.com \\",
            '    --from agent@example.org --subject Hello --text "Hi Bob" --intent "welcome Bob"',
            "evq enqueue --file request.json -o json",
        ),
    ),
    Command(
        "keys.create",
        "Create an API key and print it once (only its hash is stored).",
        "Create an API key and print it once (only its hash is stored).\n\n"
        "The first key of a fresh install is an admin key and needs no key itself: "
        "`evq keys create --name NAME --role admin`. Every later one needs an admin key.",
        Effect.WRITE,
        (
            Param("name", required=True, help="Who holds the key; recorded as the actor in evidence. Never reused."),
            Param("role", required=True, enum=tuple(r.value for r in Role), help=ROLE_HELP),
            DRY_RUN,
            api_key(Permission.MANAGE_KEYS),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.MANAGE_KEYS,
    ),
    Command(
        "keys.list",
        "List API keys (names, roles, prefixes; never the keys), oldest first.",
        "List API keys (names, roles, prefixes; never the keys), oldest first.",
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
    ),
    Command(
        "keys.revoke",
        "Revoke a key; it is refused from the next command on.",
        "Revoke a key; it is refused from the next command on. Revoking a revoked "
        "key changes nothing; the last active admin key cannot be revoked (exit 3).",
        Effect.WRITE,
        (
            Param("name", Kind.ARGUMENT, required=True),
            DRY_RUN,
            api_key(Permission.MANAGE_KEYS),
            OUTPUT,
            DATABASE_URL,
        ),
        permission=Permission.MANAGE_KEYS,
    ),
    Command(
        "mcp",
        "Serve evq's commands as MCP tools over stdio (for an agent's MCP client).",
        "Serve evq's commands as MCP tools over stdio (for an agent's MCP client): "
        "evq_email_send, evq_steps_get, evq_steps_list, evq_runs_get, and "
        "evq_steps_resolve with EVQ_MCP_RESOLVE=true (it dry-runs unless told not to).\n\n"
        "The API key comes from EVQ_API_KEY in the server's environment, never from a "
        "tool's arguments; every call is checked with it (reads: any role). stdout is "
        "the protocol's: logs go to stderr, and -o json prints only an error at startup.",
        # Its tools enqueue (and, with EVQ_MCP_RESOLVE, resolve); the worker sends.
        Effect.WRITE,
        (OUTPUT, DATABASE_URL),
        examples=("EVQ_API_KEY=evq_... evq mcp",),
    ),
    Command(
        "providers.list",
        "List every provider's circuit, and why an open one opened.",
        "List every provider's circuit: closed (sending), open (down or misconfigured: "
        "nothing is sent, attempts are not charged, a probe goes out after the wait shown) "
        "or half_open (one probe is out). An open circuit shows why it opened.",
        Effect.READ,
        (OUTPUT, DATABASE_URL),
    ),
    Command(
        "prune",
        "Delete accepted and rejected steps older than --older-than, with their evidence and decisions.",
        "Delete accepted and rejected steps older than --older-than, with their "
        "evidence and decisions, in batches; each batch is one transaction and one row "
        "of prune_log. Steps in flight, retryable or unknown are never deleted, nor a "
        "step whose failure notice is not yet old and terminal (it goes with its notice). "
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
        examples=("evq prune --older-than 90d --dry-run", "evq prune --older-than 90d -o json"),
    ),
    Command(
        "runs.show",
        "Show one run's whole chain in time order.",
        "Show one run's whole chain in time order: each decision (intent, instruction "
        "and prompt version, model, tool), its action, every attempt with the adapter's "
        "answer, and every operator close.",
        Effect.READ,
        (Param("run_id", Kind.ARGUMENT, required=True), OUTPUT, DATABASE_URL),
    ),
    Command(
        "schema",
        "Describe evq's commands for scripts and agents, a level at a time.",
        "Describe evq's commands for scripts and agents: groups, then a group's "
        "commands, then one command's parameters (flags, types, defaults, choices) "
        "and the JSON Schema of its output.",
        Effect.READ,
        (
            Param("name", Kind.ARGUMENT, repeatable=True),
            Param(
                "everything",
                Kind.FLAG,
                flags=("--all",),
                help="Every command with its parameters and output schema.",
            ),
            OUTPUT,
        ),
        examples=(
            "evq schema -o json",
            "evq schema steps -o json",
            "evq schema steps.resolve -o json      (or: evq schema steps resolve)",
        ),
    ),
    Command(
        "serve",
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
                help="Address to listen on [env: EVQ_SERVE_HOST; default: 127.0.0.1].",
            ),
            Param(
                "port",
                type="integer",
                minimum=0,
                maximum=65535,
                env="EVQ_SERVE_PORT",
                default=8080,
                setting=True,
                help="Port to listen on; 0: any free one [env: EVQ_SERVE_PORT; default: 8080].",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
        examples=("evq serve --host 127.0.0.1 --port 8080",),
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
            Param(
                "limit",
                type="integer",
                minimum=1,
                maximum=LIST_LIMIT_MAX,
                default=50,
                show_default=True,
                help="Rows per page.",
            ),
            Param(
                "offset",
                type="integer",
                minimum=0,
                maximum=MAX_ID,
                default=0,
                show_default=True,
                help="Rows to skip (meta.total counts them all).",
            ),
            OUTPUT,
            DATABASE_URL,
        ),
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
            Param("step_id", Kind.ARGUMENT, type="integer", minimum=1, maximum=MAX_ID),
            Param(
                "verdict",
                flags=("--as",),
                required=True,
                enum=tuple(v.value for v in Verdict),
                help="accepted / rejected: close the row; retry: verified not sent, send again (same key, same "
                "Message-ID).",
            ),
            Param("note", required=True, help="Why: what was checked and what was found (kept in the evidence)."),
            Param("reason", metavar="CODE", help="A machine key for the verdict, e.g. found_in_provider_log."),
            Param("provider_message_id", metavar="ID", help="The provider's id for the message, when found."),
            Param("evidence_url", metavar="URL", help="Where the proof is (a log search, a ticket)."),
            Param(
                "statuses",
                flags=("--status",),
                repeatable=True,
                enum=(Status.UNKNOWN.value,),
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
    ),
    Command(
        "steps.show",
        "Show one step: the decision behind it, the request, and every evidence row in order.",
        "Show one step: the decision behind it, the request, and every evidence row in order.",
        Effect.READ,
        (
            Param("step_id", Kind.ARGUMENT, type="integer", required=True, minimum=1, maximum=MAX_ID),
            OUTPUT,
            DATABASE_URL,
        ),
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
            Param("drain", Kind.FLAG, help="Exit 0 once nothing is claimable now and nothing is in flight."),
            OUTPUT,
        ),
    ),
)

COMMANDS: dict[str, Command] = {c.path: c for c in _TABLE}


def command(path: str) -> Command:
    return COMMANDS[path]


def top_level() -> list[str]:
    """The first words of every path: the groups and the top-level commands, sorted."""
    return sorted({path.split(".")[0] for path in COMMANDS})


def in_group(group: str) -> list[Command]:
    return [c for path, c in sorted(COMMANDS.items()) if path.startswith(group + ".")]
