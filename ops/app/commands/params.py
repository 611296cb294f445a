"""The parameters several commands share (output, database, API key, paging, the list filters, the
send request's fields, the settings as flags) and the help texts more than one command uses."""

from __future__ import annotations

from typing import Any

from evq.ops.app.commands.model import API_KEY_ENV, CREDENTIAL, Kind, Param
from evq.ops.app.service import (
    DECISION_FIELDS,
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
from evq.worker.approval_policy import PRIORITIES
from evq.worker.circuit import FAULTS
from evq.worker.keys import ALLOWED, Permission
from evq.worker.options import Option

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
