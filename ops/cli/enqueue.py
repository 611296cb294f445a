"""evq enqueue: record one send (or many, from JSON Lines), once however often it is repeated."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from adapters.postgres.enqueue import enqueue_own
from ops import wiring
from ops.cli.common import command, database_option, load_settings, output_option
from ops.cli.output import Output
from worker.errors import InvalidRequest
from worker.records import EnqueueResult

# (flag, request field, multiple, help). The request's fields, on the command line.
FIELD_FLAGS: tuple[tuple[str, str, bool, str], ...] = (
    ("--run-id", "run_id", False, "The agent run this send belongs to (required)."),
    ("--step-id", "step_id", False, "The step within the run; unique per run (required)."),
    ("--to", "to", True, "Recipient, 'addr' or 'Name <addr>'; repeat for more (at least one)."),
    ("--cc", "cc", True, "Cc recipient; repeatable."),
    ("--bcc", "bcc", True, "Bcc recipient (envelope only); repeatable."),
    ("--from", "from", False, "Sender (default: EVQ_DEFAULT_FROM)."),
    ("--reply-to", "reply_to", True, "Reply-To address; repeatable."),
    ("--subject", "subject", False, "Subject line (one line)."),
    ("--text", "text", False, "Plain-text body."),
    ("--html", "html", False, "HTML body."),
    ("--intent", "intent", False, "What the agent meant to achieve by this send."),
    ("--notify", "notify", False, "Address told if the send ends rejected."),
    ("--idempotency-key", "idempotency_key", False, "Key for this send (default: RUN_ID:STEP_ID)."),
    ("--provider", "provider", False, "Adapter to send through (default: the first of EVQ_ADAPTER)."),
)
DECISION_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("--instruction-version", "instruction_version", "Version of the instructions the agent followed."),
    ("--prompt-version", "prompt_version", "Version of the prompt."),
    ("--model", "model", "Model that made the decision."),
    ("--tool", "tool", "Tool the agent chose."),
    ("--rationale", "rationale", "Why: short text, or a JSON object."),
    ("--decided-at", "decided_at", "When the agent decided (ISO 8601 with zone)."),
)


def _request_options(fn: Any) -> Any:
    for flag, field, multiple, help_text in reversed(FIELD_FLAGS):
        fn = click.option(flag, field, multiple=multiple, default=None, help=help_text)(fn)
    for flag, field, help_text in reversed(DECISION_FLAGS):
        fn = click.option(flag, "decision_" + field, default=None, help=help_text)(fn)
    fn = click.option(
        "--header", "headers", multiple=True, metavar="'NAME: VALUE'", help="Allowed header (In-Reply-To, References, ...); repeatable."
    )(fn)
    fn = click.option("--max-attempts", type=int, default=None, help="Attempts for this step (default: EVQ_MAX_ATTEMPTS).")(fn)
    return fn


@click.command("enqueue")
@_request_options
@click.option(
    "--file",
    "file",
    metavar="F",
    default=None,
    help="Read the request as JSON from F ('-' for stdin). JSON Lines (one request per line) enqueue many in one transaction.",
)
@output_option
@database_option
@command
def enqueue_cmd(out: Output, file: str | None, database_url: str | None, **flags: Any) -> None:
    """Enqueue an email send. Repeating the same request returns the same step
    (created: false); the same key with a different request is refused (exit 3).

    \b
    evq enqueue --run-id r1 --step-id welcome --to bob@example.com \\
        --from agent@example.org --subject Hello --text "Hi Bob" --intent "welcome Bob"
    evq enqueue --file request.json -o json
    """
    settings = load_settings(database_url=database_url)
    request_from_flags = _request_from_flags(flags)
    if file is not None and request_from_flags:
        raise InvalidRequest(
            [{"field": "--file", "message": f"use either --file or request flags, not both (got {', '.join(sorted(request_from_flags))})"}]
        )
    requests = _read_file(file) if file is not None else [request_from_flags]
    url = wiring.database_url(settings)
    if len(requests) == 1:
        result = enqueue_own(url, requests[0], policy=settings.policy())
        out.success(result.to_dict(), human=_human_one)
        return
    from adapters.postgres.enqueue import enqueue_many_own

    results = enqueue_many_own(url, requests, policy=settings.policy())
    data = [r.to_dict() for r in results]
    created = sum(1 for r in results if r.created)
    out.success(
        data,
        human=lambda _: f"{len(results)} requests: {created} created, {len(results) - created} already present",
        meta={"count": len(results), "created": created},
    )


def _human_one(d: dict[str, Any]) -> str:
    verb = "enqueued" if d["created"] else "already enqueued"
    return f"{verb}: step {d['id']} ({d['status']}) run={d['run_id']} step={d['step_id']} message-id={d['message_id']}"


def _request_from_flags(flags: dict[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {}
    for _, field, multiple, _ in FIELD_FLAGS:
        value = flags.get(field)
        if multiple:
            if value:
                request[field] = list(value)
        elif value is not None:
            request[field] = value
    decision: dict[str, Any] = {}
    for _, field, _ in DECISION_FLAGS:
        value = flags.get("decision_" + field)
        if value is not None:
            decision[field] = _maybe_json(value) if field == "rationale" else value
    if decision:
        request["decision"] = decision
    if flags.get("headers"):
        request["headers"] = dict(_header(h) for h in flags["headers"])
    if flags.get("max_attempts") is not None:
        request["max_attempts"] = flags["max_attempts"]
    return request


def _header(raw: str) -> tuple[str, str]:
    name, sep, value = raw.partition(":")
    if not sep or not name.strip():
        raise InvalidRequest([{"field": "--header", "message": f"expected 'Name: value', got {raw[:60]!r}"}])
    return name.strip(), value.strip()


def _maybe_json(value: str) -> Any:
    if value.lstrip().startswith(("{", "[")):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _read_file(file: str) -> list[Any]:
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest([{"field": "--file", "message": f"cannot read {file}: {exc}"}]) from None
    try:
        return [json.loads(text)]
    except RecursionError:
        raise InvalidRequest([{"field": "--file", "message": "JSON nested too deeply"}]) from None
    except json.JSONDecodeError as whole_error:
        # Not one document: try JSON Lines, one request per non-empty line.
        requests = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                requests.append(json.loads(line))
            except (json.JSONDecodeError, RecursionError) as exc:
                message = str(whole_error) if number == 1 else f"line {number}: {exc}"
                raise InvalidRequest([{"field": "--file", "message": f"not JSON: {message}"}]) from None
        if not requests:
            raise InvalidRequest([{"field": "--file", "message": "the file holds no request"}]) from None
        return requests
