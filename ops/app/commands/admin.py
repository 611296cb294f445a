"""The admin commands (health, bench, db-version, db-upgrade, demo, mcp, serve), `evq schema`
and `evq worker run`: running and looking after an installation."""

from __future__ import annotations

from evq.ops.app.commands.model import Command, Effect, Kind, Param, Risk, Route
from evq.ops.app.commands.params import _DATABASE, _PROCESS, BENCH_MODES, DATABASE_URL, DRY_RUN, OUTPUT, _setting
from evq.ops.option_catalogue import OPTIONS

TABLE: tuple[Command, ...] = (
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
