"""`evq admin mcp`: the commands as MCP tools (official SDK, ``MCPServer``), one per command
whose table entry says ``mcp=True``, named after its canonical path (``steps.resolve`` ->
``evq_steps_resolve``, ops/app/commands/model.py's ``mcp_name``), each answering with the contract's
wrapper JSON.

- Input schemas are the command's own, from the command table the CLI is built from too
  (ops/app/commands/, through ops/app/schemas.py): the same properties an HTTP body names
  (`steps show`'s ``step_id``), and the tools validate against exactly those (the send request
  by worker/request.py); output schemas are the commands' ops/app/cli-schema files.
- The API key comes from the server's environment (EVQ_API_KEY), never from a tool's
  arguments; every call is authenticated with it (reads: any role).
- ``evq_steps_resolve`` exists only with EVQ_MCP_TOOLS=resolve, and dry-runs unless
  the call says ``dry_run: false``.
- A refused call is a tool result with ``isError`` and the contract's error (its
  ``E_*`` code), never a protocol error, so an agent reads it like any answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from evq import __version__
from evq.ops.app import approvals, service
from evq.ops.app.commands import Effect, Risk, command
from evq.ops.app.contract import Timer, failure, plain, success, to_json
from evq.ops.app.health import check_health
from evq.ops.app.schemas import check_arguments, command_input, output_schema, request_schema
from evq.ops.app.service import Caller, Selection
from evq.ops.app.waiting import WaitSlots, parse_wait, wait_step
from evq.ops.settings import Settings
from evq.worker.errors import EvqError, InvalidRequest
from evq.worker.logs import get_logger
from evq.worker.resolution import Resolution
from evq.worker.verdict import NEXT_ACTIONS

log = get_logger("evq.mcp")
KEY_SOURCE = "the MCP server's environment (EVQ_API_KEY)"
INSTRUCTIONS = """evq records email sends decided by agents: each is sent at most once and leaves evidence.
Send with evq_steps_enqueue (a repeat of the same run_id/step_id returns the same step); follow it with
evq_steps_wait (it answers when the step is worth acting on) or evq_steps_show (its state and evidence) or
evq_runs_show (a run, a page of its steps at a time: meta.total, offset); evq_providers_list says whether a
provider is down; evq_events_list tells you of every
send of yours that was rejected, became unknown or got an operator's verdict. A step whose status is `held`
waits for a person's approval (an agent key's sends are held by default: its `approval` says who may decide
and until when): do not send it again, call evq_steps_wait until a person decided (evq_steps_cancel withdraws it). A step whose status is `unknown`
may or may not have been delivered: never send it again under a new step_id; an operator decides. Every view
of a step says so itself: safe_to_retry (true only when evq knows nothing was sent) and next_action (wait,
wait_for_approval, ask_operator, none, fix_and_resend, resend).
Every result is {status, schema_version, data | error, meta}; error.code is a stable E_* code."""

Handler = Callable[[Mapping[str, Any]], Awaitable[service.Reply]]


class ContractTool(Tool):
    """A tool that takes its arguments as JSON and answers with the contract's wrapper.

    The SDK would validate arguments against a model built from a Python signature; here
    the schema is evq's own and so is the validation, so every interface refuses the same
    input with the same E_INVALID_ARG fields."""

    handler: Handler = Field(exclude=True)

    async def run(self, arguments: dict[str, Any], context: Any, convert_result: bool = False) -> Any:
        timer = Timer()
        try:
            reply = await self.handler(arguments)
        except EvqError as exc:
            if isinstance(exc, InvalidRequest):
                exc = service.json_field_names(exc)
            body = failure(exc, timer.meta())
        except Exception as exc:
            log.exception("internal_error", tool=self.name)
            body = failure(EvqError(f"internal error ({type(exc).__name__}); see the server's log"), timer.meta())
        else:
            body = success(reply.data, timer.meta(reply.meta), reply.status)
        data = plain(body)
        return CallToolResult(
            content=[TextContent(type="text", text=to_json(data))],
            structured_content=data,
            is_error=data["status"] == "error",
        )


def annotations(path: str) -> ToolAnnotations:
    """The spec's hints for table command ``path``, from its entry: a read is read-only (and
    harmless to repeat); a write may destroy what its risk says is for good (`steps resolve`
    closes rows, high risk); a send always may (an email cannot be unsent) and reaches outside
    evq (open world), but a repeat of the same request is the same step (idempotent)."""
    entry = command(path)
    read = entry.effect is Effect.READ
    send = entry.effect is Effect.SEND
    return ToolAnnotations(
        title=f"evq {entry.words}",
        read_only_hint=read,
        destructive_hint=not read and (send or entry.risk is Risk.HIGH),
        idempotent_hint=entry.repeatable,
        open_world_hint=send,
    )


def _tool(path: str, description: str, schema: dict[str, Any], handler: Handler) -> ContractTool:
    """The tool of table command ``path``: its name, its output schema, and its annotations."""
    entry = command(path)
    assert entry.mcp_tool is not None, f"{path} is not an MCP tool in the command table"
    out = output_schema(path)
    out.setdefault("type", "object")
    return ContractTool(
        fn=handler,
        name=entry.mcp_tool,
        description=description,
        parameters=schema,
        fn_metadata=FuncMetadata(arg_model=ArgModelBase, output_schema=out),
        is_async=True,
        handler=handler,
        annotations=annotations(path),
    )


def send_schema() -> dict[str, Any]:
    schema = request_schema()
    schema["properties"]["dry_run"] = {
        "type": "boolean",
        "default": False,
        "description": "Say what would happen; change nothing.",
    }
    return schema


def list_schema() -> dict[str, Any]:
    return command_input("steps.list")


def get_schema() -> dict[str, Any]:
    return command_input("steps.show")


def run_schema() -> dict[str, Any]:
    return command_input("runs.show")


def policy_schema() -> dict[str, Any]:
    return command_input("policy.show")


def providers_schema() -> dict[str, Any]:
    return command_input("providers.list")


def events_schema() -> dict[str, Any]:
    return command_input("events.list")


def deliveries_schema() -> dict[str, Any]:
    return command_input("deliveries.list")


def resolve_schema() -> dict[str, Any]:
    # The command's own parameters; only the default differs: a tool dry-runs unless told not to.
    return command_input("steps.resolve", defaults={"dry_run": True})


def held_schema(path: str) -> dict[str, Any]:
    # Like evq_steps_resolve, a tool that decides a send dry-runs unless told not to.
    return command_input(path, defaults={"dry_run": True})


def build_server(store: Any, settings: Settings, api_key: str | None, *, health: Any) -> MCPServer:
    """The MCP server over an open store; ``api_key`` is the server's own (from its environment);
    ``health`` the HealthReader of ``evq_admin_health`` (ops/wiring.py's health_reader), which
    every server offers: it is the first call an agent makes."""
    policy = settings.policy()  # worked out once (every provider's profile), not per send

    def caller() -> Caller:
        return Caller(api_key, source=KEY_SOURCE, interface="mcp")

    async def send(args: Mapping[str, Any]) -> service.Reply:
        request = dict(args)
        dry_run = request.pop("dry_run", False)
        if not isinstance(dry_run, bool):
            raise InvalidRequest([{"field": "dry_run", "message": "must be a boolean"}])
        return await service.enqueue(store, caller(), [request], policy, dry_run=dry_run, interface="mcp")

    async def get(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(get_schema(), args)
        return await service.show_step(store, caller(), a["step_id"], unresolvable=policy.unresolvable)

    # An MCP server serves one client (one key): a bound on its waits at once all the same.
    wait_slots = WaitSlots(total=16, per_caller=16)

    async def wait(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(command_input("steps.wait"), args)
        seconds = parse_wait(a["timeout"], field="timeout")
        return await wait_step(
            store, caller(), a["step_id"], timeout=seconds, unresolvable=policy.unresolvable, slots=wait_slots
        )

    async def list_(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(list_schema(), args)
        filters = {k: a[k] for k in service.FILTER_NAMES}
        return await service.list_steps(
            store,
            caller(),
            statuses=a["status"] or (),
            filters=filters,
            limit=a["limit"],
            offset=a["offset"],
            unresolvable=policy.unresolvable,
        )

    async def run(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(run_schema(), args)
        return await service.show_run(
            store, caller(), a["run_id"], limit=a["limit"], offset=a["offset"], unresolvable=policy.unresolvable
        )

    async def show_policy(args: Mapping[str, Any]) -> service.Reply:
        check_arguments(policy_schema(), args)
        return await service.show_policy(store, caller(), settings)

    async def providers(args: Mapping[str, Any]) -> service.Reply:
        check_arguments(providers_schema(), args)
        return await service.list_providers(store, caller(), settings)

    async def events(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(events_schema(), args)
        return await service.list_events(
            store,
            caller(),
            since=a["since"],
            limit=a["limit"],
            offset=a["offset"],
            key=a["key"],
            all_keys=a["all_keys"],
        )

    async def deliveries(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(deliveries_schema(), args)
        return await service.list_deliveries(
            store,
            caller(),
            unmatched=a["unmatched"],
            step=a["step"],
            provider=a["provider"],
            since=a["since"],
            limit=a["limit"],
            offset=a["offset"],
        )

    async def resolve(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(resolve_schema(), args)
        resolution = Resolution.parse(
            a["as"],
            a["note"],
            reason=a["reason"],
            provider_message_id=a["provider_message_id"],
            evidence_url=a["evidence_url"],
        )
        selection = Selection(
            step_id=a["step_id"],
            statuses=tuple(a["status"] or ()),
            filters={k: a[k] for k in service.FILTER_NAMES},
            limit=a["limit"],
            max_failures=a["max_failures"],
        )
        return await service.resolve(
            store,
            caller(),
            resolution,
            selection,
            default_max_attempts=settings.max_attempts,
            dry_run=a["dry_run"],
            unresolvable=policy.unresolvable,
        )

    async def approve(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(held_schema("steps.approve"), args)
        return await approvals.approve(
            store,
            caller(),
            a["step_id"],
            note=a["note"],
            edits=approvals.corrections(a),
            dry_run=a["dry_run"],
            policy=policy,
        )

    async def deny(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(held_schema("steps.deny"), args)
        return await approvals.deny(store, caller(), a["step_id"], note=a["note"], dry_run=a["dry_run"])

    async def cancel(args: Mapping[str, Any]) -> service.Reply:
        a = check_arguments(held_schema("steps.cancel"), args)
        return await approvals.cancel(store, caller(), a["step_id"], note=a["note"], dry_run=a["dry_run"])

    async def health_check(args: Mapping[str, Any]) -> service.Reply:
        check_arguments(command_input("admin.health"), args)
        return await check_health(health, caller(), store)

    tools = [
        _tool(
            "steps.enqueue",
            "Enqueue an email send, once however often it is repeated: the same request again "
            "returns the same step (created: false); the same run_id/step_id with a different request is refused "
            "(E_CONFLICT). Needs a key with role agent or admin.",
            send_schema(),
            send,
        ),
        _tool(
            "steps.show",
            "One step: its state, the decision behind it, the request, and every evidence row "
            "(attempts and the provider's answers) in order.",
            get_schema(),
            get,
        ),
        _tool(
            "steps.wait",
            "Wait (at most 60s, `timeout`) until a step is worth acting on, then answer as evq_steps_show: when "
            "its next_action is neither `wait` nor `wait_for_approval` (sent, refused, denied, or needs an "
            "operator; a held step until a person decides, an approved one until it is sent), or at the timeout "
            "with meta.timed_out true (call again). Call it after evq_steps_enqueue instead of polling. next_action: "
            + "; ".join(f"{name}: {meaning}" for name, meaning in NEXT_ACTIONS.items()),
            command_input("steps.wait"),
            wait,
        ),
        _tool(
            "steps.list",
            "List steps: unknown ones oldest first, the rest newest first, with filters.",
            list_schema(),
            list_,
        ),
        _tool(
            "runs.show",
            "One run's whole chain in time order: each decision, its action, every attempt with "
            "the provider's answer, and every operator close.",
            run_schema(),
            run,
        ),
        _tool(
            "policy.show",
            "The approval policy: which sends are held for a person (always, first contact, too many recipients, "
            "outside hours, over a budget) and each budget's use this window. Call it before a batch.",
            policy_schema(),
            show_policy,
        ),
        _tool(
            "providers.list",
            "Every provider's circuit: closed (sending), open (down or misconfigured, and why) or half_open.",
            providers_schema(),
            providers,
        ),
        _tool(
            "events.list",
            "Your key's event feed: every send of yours that was rejected, became unknown, or got an operator's "
            "verdict, oldest first after the cursor `since` (pass the last answer's meta.next_cursor). Poll it to "
            "learn of failures without a notify address.",
            events_schema(),
            events,
        ),
        _tool(
            "deliveries.list",
            "Delivery events from providers' webhooks (delivered, deferred, bounced, complained, opened, "
            "clicked), newest first: of one step (an agent key: only a step it enqueued), or those that matched "
            "no step (operator or admin). A step's own latest state is `delivery` in evq_steps_show.",
            deliveries_schema(),
            deliveries,
        ),
        _tool(
            "steps.cancel",
            "Cancel a send of yours not yet sent (held, pending, or retryable that cannot have gone out): it is "
            "closed rejected (reason cancelled) and never sent. In flight, or possibly delivered: refused "
            "(E_CONFLICT). Dry-runs unless dry_run is false.",
            held_schema("steps.cancel"),
            cancel,
        ),
    ]
    tools.insert(
        0,
        _tool(
            "admin.health",
            "Call this first, before writing: whether evq can do its work now (the database, its schema, "
            "workers seen recently, the collector, the providers' circuits), each check with ok and a detail. "
            "healthy: false (status partial_failure) means sends may not go out: tell your operator.",
            command_input("admin.health"),
            health_check,
        ),
    )
    # Approving and denying need an operator or admin key (an agent key is refused), and are
    # offered only when asked for (EVQ_MCP_TOOLS=approve): an agent's MCP server holds no tool that
    # could approve its own send even if it were handed a stronger key.
    if settings.mcp_approve:
        tools += [
            _tool(
                "steps.approve",
                "Approve a held send (operator or admin key only; an agent key is refused): it becomes pending with "
                "the same key and Message-ID and is sent. subject/text/html correct it first. Dry-runs unless "
                "dry_run is false.",
                held_schema("steps.approve"),
                approve,
            ),
            _tool(
                "steps.deny",
                "Deny a held send (operator or admin key only): rejected, reason denied, never sent, a known notify told. "
                "Dry-runs unless dry_run is false.",
                held_schema("steps.deny"),
                deny,
            ),
        ]
    if settings.mcp_resolve:
        tools.append(
            _tool(
                "steps.resolve",
                "Close unknown steps with an audited verdict (operator or admin key): one by step_id, or many "
                "with status [unknown] and filters. Dry-runs unless dry_run is false: look at what would change "
                "first.",
                resolve_schema(),
                resolve,
            )
        )
    # serverInfo: the client learns which evq it talks to (the version `evq --version` prints).
    return MCPServer("evq", version=__version__, instructions=INSTRUCTIONS, tools=tools, log_level="WARNING")
