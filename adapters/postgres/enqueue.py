"""The Python enqueue API: inside the caller's transaction, or in its own.

    from evq.adapters.postgres.enqueue import enqueue
    with psycopg.connect(url) as conn:          # or a SQLAlchemy Connection
        with conn.transaction():
            ...  # the caller's own writes
            step = enqueue(conn, {"run_id": ..., "step_id": ..., ...})

The key's ledger row (step_keys), decision and step are written by one statement, so they
commit or roll back with the caller's transaction; on an autocommit connection that one statement is a
transaction of its own (one round trip, as the store's pool does it). The operation is written once as a generator of
(statement, params) that receives rows; :func:`run_sync` and :func:`run_async`
drive it, so sync and async callers share every line of logic.

This module is the API the caller calls: the connection it is given, validation, the API key's
actor, and the look-up EVQ_REFUSE_UNRESOLVABLE asks for (:func:`checked_op`). The operations it
runs are single_enqueue.py's (one request) and batch_enqueue.py's (a batch), driven by
op_runner.py's run_sync and run_async, which the store (store/) runs the same operations with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg

from evq.adapters.postgres.batch_enqueue import enqueue_many_op
from evq.adapters.postgres.database import translated
from evq.adapters.postgres.op_runner import Op, run_async, run_sync
from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.single_enqueue import enqueue_op, gated_op, key_params
from evq.worker.approval_policy import gated
from evq.worker.enqueue import (
    answer_held,
    flag_ambiguity,
    merge_answers,
    must_look_up,
    validate,
    validate_many,
)
from evq.worker.errors import InvalidRequest
from evq.worker.keys import Permission, check_key, split_key
from evq.worker.logs import get_logger
from evq.worker.records import EnqueueResult
from evq.worker.refusals import describe
from evq.worker.request import Actor, Policy, ValidRequest

log = get_logger("evq.enqueue")


def checked_op(requests: Sequence[ValidRequest], policy: Policy, now: datetime | None = None, *, many: bool) -> Op:
    """The Python API's enqueue under ``policy``: with EVQ_REFUSE_UNRESOLVABLE, each request it
    concerns is looked up first and never inserted (worker/enqueue.py, must_look_up and
    answer_held: a held one is answered as its row is, a new one refused before anything is
    written); the rest enqueued (one request: step_enqueue; ``many``: the batch statement).
    Every result flagged with its step's ambiguity."""
    held: dict[int, Mapping[str, Any] | None] = {}
    for i in must_look_up(requests, policy):
        rows = yield Q["step_get_by_key"], key_params(requests[i])
        held[i] = rows[0] if rows else None
    answered = answer_held(requests, held, policy, indexed=many)
    rest = [r for i, r in enumerate(requests) if i not in answered]
    if not rest:
        made: list[EnqueueResult] = []
    elif many:
        made = yield from enqueue_many_op(rest, now, policy.approval)
    elif gated(policy.approval, rest):
        made = [(yield from gated_op(rest[0], policy.approval, now))]
    else:
        made = [(yield from enqueue_op(rest[0], now))]
    results = merge_answers(answered, made)
    return [flag_ambiguity(r, v, policy) for r, v in zip(results, requests, strict=True)]


def _run_checked(conn: psycopg.Connection, requests: Sequence[ValidRequest], policy: Policy, op: Op) -> Any:
    """:func:`run_sync`; a gated enqueue on an autocommit connection in a transaction of its
    own (its statements commit together). In the caller's transaction it is the caller's."""
    if conn.autocommit and gated(policy.approval, requests):
        with conn.transaction():
            return run_sync(conn, op)
    return run_sync(conn, op)


async def _run_checked_async(
    conn: psycopg.AsyncConnection, requests: Sequence[ValidRequest], policy: Policy, op: Op
) -> Any:
    if conn.autocommit and gated(policy.approval, requests):
        async with conn.transaction():
            return await run_async(conn, op)
    return await run_async(conn, op)


def _driver_connection(conn: Any) -> Any:
    """The psycopg connection behind a psycopg or SQLAlchemy connection."""
    if isinstance(conn, (psycopg.Connection, psycopg.AsyncConnection)):
        return conn
    raw = getattr(conn, "connection", None)  # sqlalchemy.Connection -> pool proxy
    driver = getattr(raw, "driver_connection", None)
    if isinstance(driver, psycopg.Connection):
        return driver
    raise TypeError(
        f"enqueue needs a psycopg connection or a SQLAlchemy connection using psycopg, got {type(conn).__name__}"
    )


def enqueue(
    conn: Any,
    request: Mapping[str, Any] | ValidRequest,
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> EnqueueResult:
    """Enqueue one send inside ``conn``'s current transaction (psycopg or SQLAlchemy, sync).

    Raises InvalidRequest before anything is written, IdempotencyConflict when the
    key is taken by a different request (another payload or another provider). Commit is
    the caller's. A repeat of a key whose step evq prune removed is answered from the key
    ledger as the step ended (``pruned`` true, ``created`` false): nothing is written or sent.

    A ``policy`` from the settings (``Settings.load().policy()``) names the providers that
    could never settle a lost answer (docs/design.md, "Provider profiles"): the result's
    ``ambiguity`` is then ``"unresolvable"`` for a step through one, and with
    EVQ_REFUSE_UNRESOLVABLE such a request is refused (Unresolvable, E_UNRESOLVABLE) before
    anything is written, unless a step already holds its key: that one is answered as it is
    (``created`` false). The default ``Policy()`` knows no profiles and flags nothing.

    ``api_key`` (``evq_...``, a key that may enqueue): the send is the key's, as if it came
    through the CLI with that key: checked on ``conn`` (AuthFailed when it is not valid or its
    role may not enqueue), recorded as its actor, and judged by its approval (always, policy or
    never; docs/design.md, "Approvals and budgets"). Without one, the send is nobody's key's and
    the installation's rules (``policy.approval``) decide, as they always did.
    """
    conn = _driver_connection(conn)
    valid = _stamped(validate(request, policy), actor, api_key, lambda op: run_sync(conn, op))
    [result] = _run_checked(conn, [valid], policy, checked_op([valid], policy, now, many=False))
    return result


async def enqueue_async(
    conn: Any,
    request: Mapping[str, Any] | ValidRequest,
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> EnqueueResult:
    """The same for a psycopg AsyncConnection or a SQLAlchemy AsyncConnection."""
    valid = validate(request, policy)
    if not isinstance(conn, psycopg.AsyncConnection):
        raw = await conn.get_raw_connection()  # sqlalchemy.ext.asyncio.AsyncConnection
        conn = raw.driver_connection
    key = None if api_key is None else await run_async(conn, key_actor_op(api_key))
    valid = _stamped(valid, actor, api_key, lambda op: key)
    [result] = await _run_checked_async(conn, [valid], policy, checked_op([valid], policy, now, many=False))
    return result


def enqueue_many(
    conn: Any,
    requests: Sequence[Mapping[str, Any] | ValidRequest],
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> list[EnqueueResult]:
    """Enqueue several sends inside ``conn``'s current transaction, in one round trip.

    Every request is validated first: one bad request raises InvalidRequest naming it
    (``[index].field``) and nothing is written. Commit is the caller's. ``api_key``: as
    :func:`enqueue`'s.
    """
    conn = _driver_connection(conn)
    checked = validate_many(list(requests), policy)
    key = None if api_key is None else run_sync(conn, key_actor_op(api_key))
    valid = [_stamped(v, actor, api_key, lambda op: key) for v in checked]
    return list(_run_checked(conn, valid, policy, checked_op(valid, policy, now, many=True)))


async def enqueue_many_async(
    conn: Any,
    requests: Sequence[Mapping[str, Any] | ValidRequest],
    *,
    policy: Policy = Policy(),
    now: datetime | None = None,
    actor: str | None = None,
    api_key: str | None = None,
) -> list[EnqueueResult]:
    """The same for a psycopg AsyncConnection or a SQLAlchemy AsyncConnection."""
    checked = validate_many(list(requests), policy)
    if not isinstance(conn, psycopg.AsyncConnection):
        raw = await conn.get_raw_connection()
        conn = raw.driver_connection
    key = None if api_key is None else await run_async(conn, key_actor_op(api_key))
    valid = [_stamped(v, actor, api_key, lambda op: key) for v in checked]
    return list(await _run_checked_async(conn, valid, policy, checked_op(valid, policy, now, many=True)))


def enqueue_own(
    url: str,
    request: Mapping[str, Any] | ValidRequest,
    *,
    policy: Policy = Policy(),
    record_refusals: bool = True,
    actor: str | None = None,
    api_key: str | None = None,
) -> EnqueueResult:
    """Enqueue in a transaction of its own (opens and closes one connection).

    Autocommit: decision and step are one statement, so that statement is the whole
    transaction, without a BEGIN and a COMMIT round trip around it.

    A refused request is recorded in ``enqueue_refusals`` (interface ``python``, no key
    name: this API takes none) before InvalidRequest is raised, unless ``record_refusals``
    is false; a failure to record it never replaces the refusal. :func:`enqueue` and the
    other calls inside the caller's transaction record nothing: a row written there would
    go with the caller's rollback, and one written on another connection would need a
    connection this API was not given. Their refusals are counted by this process's
    ``evq_validation_errors_total`` only. ``api_key``: as :func:`enqueue`'s.
    """
    from evq.adapters.postgres.database import connect_kwargs

    try:
        checked = validate(request, policy)
        with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
            valid = _stamped(checked, actor, api_key, lambda op: run_sync(conn, op))
            [result] = _run_checked(conn, [valid], policy, checked_op([valid], policy, many=False))
            return result
    except InvalidRequest as exc:  # its fields, or E_UNRESOLVABLE for a step it would create
        if record_refusals:
            _record_refusal(url, request, exc)
        raise


def _record_refusal(url: str, request: Any, exc: InvalidRequest) -> None:
    """The refusal in a statement (a transaction) of its own; best effort."""
    from evq.adapters.postgres.database import connect_kwargs
    from evq.adapters.postgres.store.refusals import refusal_params

    params = refusal_params(describe("python", [request], exc.errors, key_name=None))
    try:
        with translated(url), psycopg.connect(url, autocommit=True, **connect_kwargs()) as conn:
            conn.execute(Q["refusal_record"], params)
    except Exception as failure:
        log.warning("refusal_not_recorded", interface="python", error_class=type(failure).__name__)


# Where the Python API's caller gives a key (the words of an AuthFailed's hint).
PYTHON_KEY_SOURCE = "the api_key= argument"


def key_actor_op(presented: str) -> Op:
    """The Python API's ``api_key=``: the key's row read on the caller's connection and checked
    as every interface checks a key (worker/keys.py, check_key; it must may enqueue), and the
    actor it makes: its name, public id and approval, interface ``python``."""
    parts = split_key(presented)
    rows = yield Q["api_key_by_id"], {"key_id": parts[0] if parts else ""}
    row = rows[0] if rows and rows[0]["name"] is not None else None
    who = check_key(presented, row, Permission.ENQUEUE, source=PYTHON_KEY_SOURCE)
    return Actor(interface="python", key_id=who.key_id, name=who.name, approval=str(who.approval))


def _stamped(request: ValidRequest, actor: str | None, api_key: str | None, run: Any) -> ValidRequest:
    """The request with the Python API's actor: the key's (``run`` drives key_actor_op on the
    caller's connection) or, without a key, whatever ``actor=`` named."""
    if api_key is None:
        return _as_python(request, actor)
    if actor is not None:
        raise TypeError("give actor= or api_key=, not both: a key's name is its actor")
    if request.actor is not None:
        return request
    return replace(request, actor=run(key_actor_op(api_key)))


def _as_python(request: ValidRequest, actor: str | None) -> ValidRequest:
    """The request as the Python API enqueues it: no key, so the actor is whatever the
    caller named (``actor=``, maybe None) and the interface is ``python``. A request
    an interface already stamped (a ValidRequest passed through) keeps its actor."""
    if request.actor is not None:
        return request
    return replace(request, actor=Actor(interface="python", name=actor))
