"""The keys commands: create, list, revoke and update API keys."""

from __future__ import annotations

from dataclasses import replace

from evq.ops.app.commands.model import API_KEY_ENV, Command, Effect, Kind, Param, Risk
from evq.ops.app.commands.params import (
    APPROVAL_HELP,
    DATABASE_URL,
    DRY_RUN,
    NOTIFY_EMAIL_HELP,
    NOTIFY_URL_HELP,
    OUTPUT,
    ROLE_HELP,
    api_key,
)
from evq.worker.approval_policy import KeyApproval
from evq.worker.keys import Permission, Role

TABLE: tuple[Command, ...] = (
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
)
