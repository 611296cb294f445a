"""The steps commands: enqueue, list, show, wait, resolve, approve, deny, cancel and prune."""

from __future__ import annotations

from evq.ops.app.commands.model import Command, Effect, Kind, Param, Risk, Route
from evq.ops.app.commands.params import (
    _STEP_ID,
    CONTENT_KEY,
    DATABASE_URL,
    DRY_RUN,
    OUTPUT,
    _filters,
    _page,
    _send_request,
    api_key,
)
from evq.ops.app.service import (
    MAX_ID,
)
from evq.ops.app.waiting import WAIT_DEFAULT
from evq.worker.keys import ALLOWED, Permission
from evq.worker.pruner import RETENTION_HELP
from evq.worker.resolution import Verdict
from evq.worker.states import Status
from evq.worker.verdict import NEXT_ACTIONS

TABLE: tuple[Command, ...] = (
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
)
