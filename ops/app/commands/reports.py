"""The read-only reports beside the steps: deliveries, events, policy, providers, refusals and runs."""

from __future__ import annotations

from evq.ops.app.commands.model import API_KEY_ENV, CREDENTIAL, Command, Effect, Kind, Param, Route
from evq.ops.app.commands.params import DATABASE_URL, OUTPUT, _page
from evq.ops.app.service import (
    EVENTS_LIMIT_MAX,
    MAX_ID,
)
from evq.worker.keys import Permission

TABLE: tuple[Command, ...] = (
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
)
