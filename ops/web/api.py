"""The HTTP API under /v1: the CLI's commands over HTTP, through ops/app/service.py, with the
contract's wrapper as every body. Every route needs ``Authorization: Bearer <key>``
(reads: any role; enqueue: agent or admin; resolve: operator or admin).

Each route is one the command table lists for its command (ops/app/commands.py, ``http``), and
its ``operationId`` is the command's canonical name (``steps.resolve``; a second route of the same
command ``steps.resolve.by_step_id``), with ``x-evq-command`` naming the command: :func:`operation`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse

from evq.ops.app import approvals, service
from evq.ops.app.commands import COMMANDS as TABLE
from evq.ops.app.commands import Command, command
from evq.ops.app.contract import Timer, plain, success
from evq.ops.app.health import check_health
from evq.ops.app.schemas import check_arguments, command_input, request_schema
from evq.ops.app.service import MAX_ID, Caller, Reply
from evq.ops.app.waiting import parse_wait, wait_step
from evq.ops.web.openapi import component_name, ref
from evq.ops.web.protocol import KEY_SOURCE, BadRequest, TooManyFailures, bearer_key, read_json
from evq.ops.web.state import AppState
from evq.worker import metrics
from evq.worker.errors import BadKey, InvalidRequest
from evq.worker.keys import Permission
from evq.worker.resolution import Resolution
from evq.worker.states import Status

# The bulk-only parameters of `steps resolve`; the single-row body has the rest.
_BULK = ("statuses", *service.FILTER_NAMES, "limit", "max_failures")
T = TypeVar("T")
_LIST = command("steps.list")
# The commands with routes, whose output schemas the OpenAPI document carries.
COMMANDS = [path for path, entry in TABLE.items() if entry.http]


def operation(path: str, route: int = 0, **openapi_extra: Any) -> dict[str, Any]:
    """The route decorator's naming of command ``path``'s ``route``-th route (the table's order)."""
    entry = command(path)
    return {
        "operation_id": entry.operation_id(entry.http[route]),
        "openapi_extra": {**openapi_extra, "x-evq-command": path},
    }


_REFUSALS = command("refusals.list")
_RUN = command("runs.show")
_EVENTS = command("events.list")
_DELIVERIES = command("deliveries.list")


def query(dest: str, *, of: Command = _LIST, **http: Any) -> Any:
    """A query parameter of command ``of``'s GET route (`GET /v1/steps` unless told) as the
    command table describes it; ``http``: the bounds only HTTP needs (a query string's length)."""
    p = of.param(dest)
    bounds: dict[str, Any] = {"ge": p.minimum, "le": p.maximum} if p.type == "integer" else {}
    if p.max_length is not None:
        bounds["max_length"] = p.max_length
    return Query(list(p.default) if p.repeatable else p.default, description=p.help, **{**bounds, **http})


_STATUSES = query("statuses")  # a list default: one shared marker, never mutated


def resolve_one_schema() -> dict[str, Any]:
    return command_input("steps.resolve", exclude=("step_id", *_BULK))


def resolve_bulk_schema() -> dict[str, Any]:
    """The command's whole input: one row by step_id, or many by status and filters."""
    return command_input("steps.resolve")


async def caller(request: Request) -> Caller:
    """The key of this request, checked for reading before anything else is looked at; an
    address that presented too many wrong keys lately gets 429 without a look (ops/web/throttle.py)."""
    state: AppState = request.app.state.evq
    who = bearer_caller(request)
    await checked(state, client_address(request), lambda: who.identify(state.store, Permission.READ))
    return who


def bearer_caller(request: Request) -> Caller:
    """The caller of an API request: its bearer key, checked by worker/keys.py as every interface's."""
    return Caller(bearer_key(request.headers.get("authorization")), source=KEY_SOURCE, interface="http")


def client_address(request: Request) -> str | None:
    return request.client.host if request.client else None


async def checked(state: AppState, address: str | None, check: Callable[[], Awaitable[T]]) -> T:
    """``check()`` (a key check), unless ``address`` is throttled; a wrong or revoked key
    counts against it (no key at all, or a good key whose role may not, does not)."""
    wait = state.throttle.retry_after(address)
    if wait is not None:
        metrics.labelled(metrics.SERVE_REFUSED, "throttled").inc()
        raise TooManyFailures(wait)
    try:
        return await check()
    except BadKey:
        state.throttle.failed(address)
        raise


def no_unknown_query(request: Request) -> None:
    """A misspelt filter must not silently widen a query (or a bulk close)."""
    route = request.scope.get("route")
    known = {p.alias for p in route.dependant.query_params} if route is not None else set()
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise InvalidRequest([{"field": name[:100], "message": "unknown query parameter"} for name in unknown])


def _answer(reply: Reply, timer: Timer, status: int = 200) -> JSONResponse:
    return JSONResponse(plain(success(reply.data, timer.meta(reply.meta), reply.status)), status_code=status)


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": ref("error_response")}}}


def _responses(command: str, *ok: int, **more: str) -> dict[int | str, Any]:
    """The success codes (the command's output schema) and every error a route can answer."""
    out: dict[int | str, Any] = {
        code: {
            "description": "the contract's wrapper",
            "content": {"application/json": {"schema": ref(component_name(command))}},
        }
        for code in ok
    }
    out.update(
        {
            400: _error(
                "a malformed request: NUL in the path or query, a bad Content-Length, or a query parameter the "
                "route does not take or cannot read; error.context.fields names each (E_INVALID_ARG)"
            ),
            401: _error("no key, or a wrong or revoked one (E_AUTH_FAILED)"),
            403: _error("the key's role may not do this (E_AUTH_FAILED)"),
            408: _error("the request's headers or body did not arrive in time (E_INVALID_ARG)"),
            413: _error("the body is larger than EVQ_SERVE_MAX_BODY (E_INVALID_ARG)"),
            422: _error("an invalid body or path parameter; error.context.fields names each (E_INVALID_ARG)"),
            429: _error(
                "this address presented too many wrong keys lately; Retry-After says when to try again (E_AUTH_FAILED)"
            ),
            503: _error("the database is unavailable or not at this evq's schema"),
        }
    )
    out.update({int(code[1:]): _error(text) for code, text in more.items()})
    return out


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {
            "400": _error("malformed JSON, or nested too deeply (E_INVALID_ARG)"),
            "415": _error("the body is not application/json (E_INVALID_ARG)"),
        },
    }


router = APIRouter(prefix="/v1", dependencies=[Depends(no_unknown_query)], tags=["v1"])


@router.post(
    "/steps",
    summary="Enqueue an email send (one request, or a JSON array of many in one transaction)",
    description="The same request again returns the same step (200, created: false); the same key with a "
    "different request is refused (409) and writes nothing. Needs a key with role agent or admin "
    "(dry_run: any role).",
    status_code=201,
    responses=_responses(
        "steps.enqueue",
        200,
        201,
        s409="the key is taken by a different request: another payload or provider (E_CONFLICT)",
        s422="invalid body, error.context.fields names each (E_INVALID_ARG); or the provider could never settle "
        "a lost answer and EVQ_REFUSE_UNRESOLVABLE is on (E_UNRESOLVABLE)",
    ),
    **operation(
        "steps.enqueue",
        **_body({"anyOf": [request_schema(), {"type": "array", "minItems": 1, "items": request_schema()}]}),
    ),
)
async def enqueue(
    request: Request,
    who: Caller = Depends(caller),
    dry_run: bool = Query(False, description="Say what would happen to each request; change nothing."),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    body = await read_json(request.body, request.headers.get("content-type"))
    many = isinstance(body, list)
    requests = body if many else [body]
    reply = await service.enqueue(
        state.store, who, requests, state.policy, many=many, dry_run=dry_run, interface="http"
    )
    return _answer(reply, request.state.timer, 201 if reply.created else 200)


@router.get(
    "/steps",
    summary="List steps: unknown ones oldest first, the rest newest first",
    responses=_responses("steps.list", 200),
    **operation("steps.list"),
)
async def list_steps(
    request: Request,
    who: Caller = Depends(caller),
    status: list[Status] = _STATUSES,
    run_id: str | None = query("run_id", max_length=200),
    provider: str | None = query("provider", max_length=200),
    older_than: str | None = query("older_than", max_length=20),
    recipient_domain: str | None = query("recipient_domain", max_length=255),
    # The issue's name is q (the search box's); `search` is the command's own name, taken too.
    q: str | None = Query(
        None, description="The same as search (the ops page's search box).", max_length=_LIST.param("search").max_length
    ),
    search: str | None = query("search"),
    subject: str | None = query("subject"),
    limit: int = query("limit"),
    # At most a 32-bit offset over HTTP: a larger one is a mistake, not a page (check_arguments' bound too).
    offset: int = query("offset", le=2**31 - 1),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    if q is not None and search is not None and q.strip() != search.strip():
        raise InvalidRequest([{"field": "q", "message": "give q or search, not two different searches"}])
    filters = {
        "run_id": run_id,
        "provider": provider,
        "older_than": older_than,
        "recipient_domain": recipient_domain,
        "search": q if q is not None else search,
        "subject": subject,
    }
    reply = await service.list_steps(
        state.store,
        who,
        statuses=[str(s) for s in status],
        filters=filters,
        limit=limit,
        offset=offset,
        unresolvable=state.policy.unresolvable,
    )
    return _answer(reply, request.state.timer)


@router.get(
    "/steps/{step_id}",
    summary="One step: the decision behind it, the request, every evidence row",
    description="With `wait` (`30s`, at most 60s), the answer waits until the step is worth acting on "
    "(its next_action is neither `wait` nor `wait_for_approval`: a held step until a person decides, an "
    "approved one until it is sent) or the time is up (`meta.timed_out`: true, call again): `evq steps wait`.",
    responses=_responses("steps.show", 200, s404="no such step (E_NOT_FOUND)"),
    **operation("steps.show"),
)
async def show_step(
    request: Request,
    step_id: int = Path(ge=1, le=MAX_ID),
    who: Caller = Depends(caller),
    wait: str | None = Query(
        None,
        max_length=20,
        description="Wait this long at most (30s, 1m, 500ms; at most 60s) for the step to be worth acting on: "
        "`evq steps wait`'s --timeout.",
    ),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    unresolvable = state.policy.unresolvable
    if wait is None:
        reply = await service.show_step(state.store, who, step_id, unresolvable=unresolvable)
    else:
        seconds = parse_wait(wait, field="wait")
        reply = await wait_step(
            state.store, who, step_id, timeout=seconds, unresolvable=unresolvable, slots=state.wait_slots
        )
    return _answer(reply, request.state.timer)


# A path converter: run ids may hold "/" (the CLI takes any), sent as is or as %2F.
@router.get(
    "/runs/{run_id:path}",
    summary="One run's whole chain in time order",
    description="The run id may contain `/`, as is or encoded (`%2F`).",
    responses=_responses("runs.show", 200, s404="no such run (E_NOT_FOUND)"),
    **operation("runs.show"),
)
async def show_run(
    request: Request,
    run_id: str = Path(min_length=1, max_length=200),
    who: Caller = Depends(caller),
    limit: int = query("limit", of=_RUN),
    # At most a 32-bit offset over HTTP, as `GET /v1/steps`.
    offset: int = query("offset", of=_RUN, le=2**31 - 1),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    reply = await service.show_run(
        state.store, who, run_id, limit=limit, offset=offset, unresolvable=state.policy.unresolvable
    )
    return _answer(reply, request.state.timer)


@router.get(
    "/refusals",
    summary="Refused enqueues, newest first: what was asked, by which key, every failing field",
    description="Bounded and scrubbed: identifiers, field names, a digest and size of the request, never its "
    "body or a key. Any role may read.",
    responses=_responses("refusals.list", 200),
    **operation("refusals.list"),
)
async def list_refusals(
    request: Request,
    who: Caller = Depends(caller),
    key: str | None = query("key_name", of=_REFUSALS, max_length=64),
    interface: Literal["cli", "http", "mcp", "python"] | None = query("interface", of=_REFUSALS),
    before_id: int | None = query("before_id", of=_REFUSALS),
    limit: int = query("limit", of=_REFUSALS),
    # At most a 32-bit offset over HTTP, as `GET /v1/steps`.
    offset: int = query("offset", of=_REFUSALS, le=2**31 - 1),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    reply = await service.list_refusals(
        state.store, who, key_name=key, interface=interface, before_id=before_id, limit=limit, offset=offset
    )
    return _answer(reply, request.state.timer)


@router.get(
    "/events",
    summary="The key's event feed: every rejection, unknown and operator verdict on its sends, after a cursor",
    description="Poll with `since` set to the last answer's meta.next_cursor. An operator or admin key reads "
    "another key's feed with `key` (its name), or every key's with `all_keys`.",
    responses=_responses("events.list", 200),
    **operation("events.list"),
)
async def list_events(
    request: Request,
    who: Caller = Depends(caller),
    since: int = query("since", of=_EVENTS),
    limit: int = query("limit", of=_EVENTS),
    offset: int = query("offset", of=_EVENTS, le=2**31 - 1),
    key: str | None = query("key", of=_EVENTS, max_length=64),
    all_keys: bool = Query(False, description=_EVENTS.param("all_keys").help),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    reply = await service.list_events(
        state.store, who, since=since, limit=limit, offset=offset, key=key, all_keys=all_keys
    )
    return _answer(reply, request.state.timer)


@router.get(
    "/deliveries",
    summary="Delivery events from providers' webhooks, newest first; unmatched=true for those no step claimed",
    description="Page back with `since` set to meta.next_cursor. An agent key reads only the events of a step it "
    "enqueued (`step`); every other view needs an operator or admin key.",
    responses=_responses("deliveries.list", 200),
    **operation("deliveries.list"),
)
async def list_deliveries(
    request: Request,
    who: Caller = Depends(caller),
    unmatched: bool = Query(False, description=_DELIVERIES.param("unmatched").help),
    step: int | None = query("step", of=_DELIVERIES),
    provider: str | None = query("provider", of=_DELIVERIES, max_length=64),
    since: int | None = query("since", of=_DELIVERIES),
    limit: int = query("limit", of=_DELIVERIES),
    offset: int = query("offset", of=_DELIVERIES, le=2**31 - 1),
) -> JSONResponse:
    state: AppState = request.app.state.evq
    reply = await service.list_deliveries(
        state.store, who, unmatched=unmatched, step=step, provider=provider, since=since, limit=limit, offset=offset
    )
    return _answer(reply, request.state.timer)


@router.post(
    "/steps/{step_id}/resolve",
    summary="Close one unknown step with an audited verdict",
    description="Only unknown rows can be resolved (409 otherwise, with the state it is in). Needs a key with "
    "role operator or admin (dry_run: any role).",
    responses=_responses(
        "steps.resolve", 200, s404="no such step (E_NOT_FOUND)", s409="the step is not unknown (E_CONFLICT)"
    ),
    **operation("steps.resolve", 1, **_body(resolve_one_schema())),
)
async def resolve_one(
    request: Request, step_id: int = Path(ge=1, le=MAX_ID), who: Caller = Depends(caller)
) -> JSONResponse:
    args = await _arguments(request, resolve_one_schema())
    selection = service.Selection(step_id=step_id)
    return await _resolve(request, who, args, selection)


@router.post(
    "/steps/resolve",
    summary="Close unknown steps with an audited verdict: one by step_id, or every one a filter matches",
    description='The body is `evq steps resolve`\'s parameters: `step_id` for one row, or `status: ["unknown"]` '
    "and filters for many (preview with dry_run first). In bulk each row is closed on its own: some may fail "
    "(someone closed them first) while the rest succeed (status partial_failure, each row's result in "
    "data.results).",
    responses=_responses(
        "steps.resolve",
        200,
        s404="no such step (E_NOT_FOUND)",
        s409="the step is not unknown (E_CONFLICT), or bulk stopped after max_failures consecutive failures "
        "(E_MAX_FAILURES)",
    ),
    **operation("steps.resolve", **_body(resolve_bulk_schema())),
)
async def resolve_bulk(request: Request, who: Caller = Depends(caller)) -> JSONResponse:
    args = await _arguments(request, resolve_bulk_schema())
    selection = service.Selection(
        step_id=args["step_id"],
        statuses=tuple(args["status"] or ()),
        filters={k: args[k] for k in service.FILTER_NAMES},
        limit=args["limit"],
        max_failures=args["max_failures"],
    )
    return await _resolve(request, who, args, selection)


def held_schema(path: str) -> dict[str, Any]:
    """`steps approve|deny|cancel`'s body: its parameters but the STEP_ID of the path."""
    return command_input(path, exclude=("step_id",))


@router.post(
    "/steps/{step_id}/approve",
    summary="Approve a held send: it becomes pending (same key and Message-ID) and is sent",
    description="Needs a key with role operator or admin (an agent key: 403); `note` is required. `subject`, "
    "`text`, `html` correct the message first (a new request hash; the evidence shows both); `drop_html` "
    "removes the HTML part, and a corrected `text` of a send with one needs `html` or `drop_html` too (422). "
    "Only a held step (409 otherwise).",
    responses=_responses(
        "steps.approve", 200, s404="no such step (E_NOT_FOUND)", s409="the step is not held (E_CONFLICT)"
    ),
    **operation("steps.approve", **_body(held_schema("steps.approve"))),
)
async def approve_step(
    request: Request, step_id: int = Path(ge=1, le=MAX_ID), who: Caller = Depends(caller)
) -> JSONResponse:
    state: AppState = request.app.state.evq
    args = await _arguments(request, held_schema("steps.approve"))
    reply = await approvals.approve(
        state.store,
        who,
        step_id,
        note=args["note"],
        edits=approvals.corrections(args),
        dry_run=args["dry_run"],
        policy=state.policy,
    )
    return _answer(reply, request.state.timer)


@router.post(
    "/steps/{step_id}/deny",
    summary="Deny a held send: rejected (reason denied), never sent, a known notify address told",
    description="Needs a key with role operator or admin (an agent key: 403); `note` is required. Only a held "
    "step (409 otherwise).",
    responses=_responses(
        "steps.deny", 200, s404="no such step (E_NOT_FOUND)", s409="the step is not held (E_CONFLICT)"
    ),
    **operation("steps.deny", **_body(held_schema("steps.deny"))),
)
async def deny_step(
    request: Request, step_id: int = Path(ge=1, le=MAX_ID), who: Caller = Depends(caller)
) -> JSONResponse:
    state: AppState = request.app.state.evq
    args = await _arguments(request, held_schema("steps.deny"))
    reply = await approvals.deny(state.store, who, step_id, note=args["note"], dry_run=args["dry_run"])
    return _answer(reply, request.state.timer)


@router.post(
    "/steps/{step_id}/cancel",
    summary="Cancel a send not yet sent (held, pending, retryable that cannot have gone out)",
    description="The key that enqueued the step, or an operator or admin key (another agent key: 403). A step "
    "in flight, or one that may have been delivered, is 409.",
    responses=_responses(
        "steps.cancel",
        200,
        s404="no such step (E_NOT_FOUND)",
        s409="in flight, may have been delivered, or already closed (E_CONFLICT)",
    ),
    **operation("steps.cancel", **_body(held_schema("steps.cancel"))),
)
async def cancel_step(
    request: Request, step_id: int = Path(ge=1, le=MAX_ID), who: Caller = Depends(caller)
) -> JSONResponse:
    state: AppState = request.app.state.evq
    args = await _arguments(request, held_schema("steps.cancel"))
    reply = await approvals.cancel(state.store, who, step_id, note=args["note"], dry_run=args["dry_run"])
    return _answer(reply, request.state.timer)


@router.get(
    "/policy",
    summary="The approval policy and the budgets' use in their current windows",
    responses=_responses("policy.show", 200),
    **operation("policy.show"),
)
async def show_policy(request: Request, who: Caller = Depends(caller)) -> JSONResponse:
    state: AppState = request.app.state.evq
    return _answer(await service.show_policy(state.store, who, state.settings), request.state.timer)


@router.get(
    "/providers",
    summary="Every provider: its profile (what settles a lost answer), rate limit and circuit",
    responses=_responses("providers.list", 200),
    **operation("providers.list"),
)
async def list_providers(request: Request, who: Caller = Depends(caller)) -> JSONResponse:
    state: AppState = request.app.state.evq
    return _answer(await service.list_providers(state.store, who, state.settings), request.state.timer)


async def _arguments(request: Request, schema: dict[str, Any]) -> dict[str, Any]:
    return check_arguments(schema, await read_json(request.body, request.headers.get("content-type")))


async def _resolve(request: Request, who: Caller, args: dict[str, Any], selection: service.Selection) -> JSONResponse:
    state: AppState = request.app.state.evq
    resolution = Resolution.parse(
        args["as"],
        args["note"],
        reason=args["reason"],
        provider_message_id=args["provider_message_id"],
        evidence_url=args["evidence_url"],
    )
    reply = await service.resolve(
        state.store,
        who,
        resolution,
        selection,
        default_max_attempts=state.settings.max_attempts,
        dry_run=bool(args["dry_run"]),
        unresolvable=state.policy.unresolvable,
    )
    return _answer(reply, request.state.timer)


@router.get(
    "/health",
    summary="Whether evq can do its work now: the first call before writing",
    description="The database, its schema, workers seen recently, the collector and the providers' circuits, "
    "each with ok and a detail. 200 when healthy; 503 with the same body (status partial_failure) when not. "
    "Needs a key (any role); while the database cannot verify one, the answer says only that it does not answer.",
    responses={
        **_responses("admin.health", 200),
        # Unhealthy is an answer, not a failure of the request: the same body as 200.
        503: {
            "description": "not healthy: the same body, status partial_failure, healthy false",
            "content": {"application/json": {"schema": ref(component_name("admin.health"))}},
        },
    },
    **operation("admin.health"),
)
async def health(request: Request) -> JSONResponse:
    state: AppState = request.app.state.evq
    who = bearer_caller(request)
    reply = await checked(state, client_address(request), lambda: check_health(state.health, who, state.store))
    return _answer(reply, request.state.timer, 200 if reply.data["healthy"] else 503)


def method_not_allowed(method: str) -> BadRequest:
    return BadRequest(405, "$method", f"{method} is not allowed here")
