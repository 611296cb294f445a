"""evq steps enqueue (formerly `evq enqueue`): record one send (or many, from JSON Lines), once however often it is repeated."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.boundedinput import read_request_file
from evq.ops.app.service import DECISION_FIELDS, REQUEST_FIELDS
from evq.ops.cli.auth import Credential
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output
from evq.ops.cli.steps import steps
from evq.ops.cli.table import from_table
from evq.ops.settings import Settings
from evq.worker import jsontext
from evq.worker.errors import EvqError, InvalidRequest
from evq.worker.logs import get_logger

log = get_logger("evq.cli")

# The request's fields as the flags carry them (ops/app/commands/ builds the flags from the same tables).
FIELD_FLAGS: tuple[tuple[str, bool], ...] = tuple((name, multiple) for name, multiple, _ in REQUEST_FIELDS)
DECISION_FLAGS: tuple[str, ...] = tuple(name for name, _ in DECISION_FIELDS)


@from_table("steps.enqueue", steps)
@command
def enqueue_cmd(
    out: Output, file: str | None, dry_run: bool, credential: Credential, database_url: str | None, **flags: Any
) -> None:
    settings = load_settings(database_url=database_url)
    request_from_flags = _request_from_flags(flags)
    if file is not None and request_from_flags:
        raise InvalidRequest(
            [
                {
                    "field": "--file",
                    "message": f"use either --file or request flags, not both (got {', '.join(sorted(request_from_flags))})",
                }
            ]
        )
    requests = _read_file(file, settings.max_input_bytes) if file is not None else [request_from_flags]
    # Validated before the database is touched: one bad request writes nothing.
    try:
        valid = service.validate_requests(requests, settings.policy())
    except InvalidRequest as exc:
        _record_refusal(settings, credential, requests, exc, dry_run=dry_run)
        raise

    async def work() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            try:
                return await service.enqueue(
                    store, credential.caller, valid, settings.policy(), many=len(valid) > 1, dry_run=dry_run
                )
            except InvalidRequest as exc:
                # E_UNRESOLVABLE, known only once the key was looked up: recorded as the field
                # errors are (what was asked, as it was asked), and only with EVQ_DATABASE_URL.
                if settings.database_url:
                    await service.record_refusal(store, credential.caller, "cli", requests, exc, dry_run=dry_run)
                raise

    reply = run(work())
    if dry_run:
        human = _human_plan
    elif len(valid) == 1:
        human = _human_one
    else:
        created = reply.meta["created"]
        human = lambda data: _human_many(data, created)  # noqa: E731
    out.reply(reply, human=human)


def _record_refusal(
    settings: Settings, credential: Credential, requests: list[Any], exc: InvalidRequest, *, dry_run: bool
) -> None:
    """The refusal recorded in the configured database (ops/app/service/: best effort, one
    short statement). Without a server's EVQ_DATABASE_URL nothing is recorded: an embedded server
    is not started only to say that nothing was enqueued."""
    if not settings.database_url or settings.database_url.strip() == "embedded":
        return

    async def work() -> None:
        async with wiring.open_store(settings, max_size=1) as store:
            await service.record_refusal(store, credential.caller, "cli", requests, exc, dry_run=dry_run)

    try:
        run(work())
    except EvqError as failure:  # the database away: the refusal is still the answer
        log.warning("refusal_not_recorded", interface="cli", error_class=type(failure).__name__)


def _human_plan(d: dict[str, Any]) -> str:
    words = {
        "create": "would create",
        "return_existing": "would return existing step",
        "refuse_conflict": "would be REFUSED (key taken by a different request): step",
    }
    lines = [
        f"{p['run_id']}/{p['step_id']} (key {p['idempotency_key']}): {words[p['action']]}"
        + (f" {p['existing_id']}" if p["existing_id"] else "")
        + (" (pruned)" if p["pruned"] else "")
        + (f" [{p['provider']}: {p['ambiguity']}]" if p["ambiguity"] else "")
        for p in d["plan"]
    ]
    return "\n".join([*lines, *_warning(d["plan"]), "dry run: nothing was changed"])


def _human_one(d: dict[str, Any]) -> str:
    verb = "enqueued" if d["created"] else "already enqueued"
    line = f"{verb}: step {d['id']} ({d['status']}) run={d['run_id']} step={d['step_id']} message-id={d['message_id']}"
    return "\n".join([line, *_pruned([d]), *_held([d]), *_warning([d])])


def _human_many(data: list[dict[str, Any]], created: int) -> str:
    line = f"{len(data)} requests: {created} created, {len(data) - created} already present"
    return "\n".join([line, *_pruned(data), *_held(data), *_warning(data)])


def _pruned(items: list[dict[str, Any]]) -> list[str]:
    """Repeats of keys whose step evq prune removed: answered from the key ledger, never sent again."""
    pruned = [i for i in items if i.get("pruned")]
    if not pruned:
        return []
    what = "its step was" if len(items) == 1 else f"{len(pruned)} of {len(items)} were steps"
    return [f"pruned: {what} removed by evq prune; answered as it ended, nothing is sent again"]


def _held(items: list[dict[str, Any]]) -> list[str]:
    """Why each held send waits for a person (the approval policy, worker/approval_policy.py)."""
    held = [i for i in items if i.get("hold")]
    if not held:
        return []
    lines = [
        f"held for approval: {len(held)} of {len(items)} (nothing is sent until an operator or admin approves; "
        "never the key that enqueued it)"
    ]
    for i in held[:10]:
        lines += [f"  step {i['id']}: {r['rule']}: {r['why']}" for r in i["hold"]["rules"]]
    # What to do next (the answer's ``approval``): wait for the decision, once per held step.
    approval = held[0].get("approval")
    if approval:
        until = f"; it expires at {approval['expires_at']}" if approval["expires_at"] else ""
        lines.append(f"wait for the decision: {approval['wait']['cli']}{until}")
    return lines


# The ambiguities this process has explained already: the warning is one short line, said once
# (its whole hint is in the -o json answer, and docs/adapters.md explains it and what to do).
_said: set[str] = set()


def _warning(items: list[dict[str, Any]]) -> list[str]:
    """The ambiguity warning (docs/design.md, "Provider profiles"), once for all the items it
    applies to, and once per process."""
    flagged = [i for i in items if i.get("ambiguity")]
    if not flagged or flagged[0]["ambiguity"] in _said:
        return []
    _said.add(flagged[0]["ambiguity"])
    return [
        f"warning: {len(flagged)} of {len(items)} {flagged[0]['ambiguity']}: if the provider's answer is lost, "
        "the step waits for an operator (docs/adapters.md, 'Unresolvable sends'; `evq providers list`)"
    ]


def _request_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {}
    for field, multiple in FIELD_FLAGS:
        value = flags.get(field)
        if multiple:
            if value:
                request[field] = list(value)
        elif value is not None:
            request[field] = value
    decision: dict[str, Any] = {}
    for field in DECISION_FLAGS:
        value = flags.get("decision_" + field)
        if value is not None:
            decision[field] = _maybe_json(value) if field == "rationale" else value
    if decision:
        request["decision"] = decision
    if flags.get("headers"):
        pairs = [_header(h) for h in flags["headers"]]
        # A dict would keep only the last of a repeated name.
        twice = sorted(name for name, n in Counter(name for name, _ in pairs).items() if n > 1)
        if twice:
            raise InvalidRequest([{"field": "--header", "message": f"{', '.join(twice)} given twice; give it once"}])
        request["headers"] = dict(pairs)
    if flags.get("max_attempts") is not None:
        request["max_attempts"] = flags["max_attempts"]
    if flags.get("require_approval"):
        request["require_approval"] = True
    for name in ("send_at", "priority"):
        if flags.get(name) is not None:
            request[name] = flags[name]
    return request


def _header(raw: str) -> tuple[str, str]:
    name, sep, value = raw.partition(":")
    if not sep or not name.strip():
        raise InvalidRequest([{"field": "--header", "message": f"expected 'Name: value', got {raw[:60]!r}"}])
    return name.strip(), value.strip()


def _maybe_json(value: str) -> Any:
    if value.lstrip().startswith(("{", "[")):
        try:
            return jsontext.loads(value)
        except jsontext.BadNumbers as exc:
            raise _numbers_refused(exc, "--rationale") from None
        except (json.JSONDecodeError, RecursionError):
            return value
    return value


def _numbers_refused(exc: jsontext.BadNumbers, where: str, line: int | None = None) -> InvalidRequest:
    at = f"{where}" + (f" line {line}" if line is not None else "")
    return InvalidRequest([{"field": path, "message": f"{at}: {message}"} for path, message in exc.fields])


def _read_file(file: str, limit: int) -> list[Any]:
    text = read_request_file(file, limit)
    try:
        return [jsontext.loads(text)]
    except jsontext.BadNumbers as exc:
        raise _numbers_refused(exc, "--file") from None
    except RecursionError:
        raise InvalidRequest([{"field": "--file", "message": "JSON nested too deeply"}]) from None
    except json.JSONDecodeError as whole_error:
        # Not one document: try JSON Lines, one request per non-empty line.
        requests = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                requests.append(jsontext.loads(line))
            except jsontext.BadNumbers as exc:
                raise _numbers_refused(exc, "--file", number) from None
            except (json.JSONDecodeError, RecursionError) as exc:
                message = str(whole_error) if number == 1 else f"line {number}: {exc}"
                raise InvalidRequest([{"field": "--file", "message": f"not JSON: {message}"}]) from None
        if not requests:
            raise InvalidRequest([{"field": "--file", "message": "the file holds no request"}]) from None
        return requests
