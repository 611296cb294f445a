"""evq steps approve | deny | cancel: the held lifecycle (issue 17), through ops/app/approvals.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from evq.ops import wiring
from evq.ops.app import approvals
from evq.ops.app.service import Reply
from evq.ops.cli.auth import Credential
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import Output
from evq.ops.cli.steps import steps
from evq.ops.cli.table import from_table
from evq.ops.settings import Settings


def _run(database_url: str | None, work: Callable[[Any, Settings], Awaitable[Reply]]) -> Reply:
    settings = load_settings(database_url=database_url)

    async def go() -> Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await work(store, settings)

    return run(go())  # type: ignore[no-any-return]


def _human(d: dict[str, Any]) -> str:
    edited = f"  (corrected: {', '.join(d['fields'])}; new hash {d['payload_sha256'][:12]})" if d["edited"] else ""
    if d["dry_run"]:
        return (
            f"dry run: step {d['id']}: {d['from_status']} -> {d['to_status']} ({d['reason']}){edited}; nothing changed"
        )
    return (
        f"step {d['id']}: {d['from_status']} -> {d['to_status']} ({d['reason']})  evidence {d['evidence_id']}{edited}"
    )


@from_table("steps.approve", steps)
@command
def steps_approve(
    out: Output,
    step_id: int,
    note: str,
    subject: str | None,
    text: str | None,
    html: str | None,
    drop_html: bool,
    dry_run: bool,
    credential: Credential,
    database_url: str | None,
) -> None:
    edits = approvals.corrections({"subject": subject, "text": text, "html": html, "drop_html": drop_html})
    reply = _run(
        database_url,
        lambda store, settings: approvals.approve(
            store,
            credential.caller,
            step_id,
            note=note,
            edits=edits,
            dry_run=dry_run,
            policy=settings.policy(),
        ),
    )
    out.reply(reply, human=_human)


@from_table("steps.deny", steps)
@command
def steps_deny(
    out: Output, step_id: int, note: str, dry_run: bool, credential: Credential, database_url: str | None
) -> None:
    reply = _run(
        database_url,
        lambda store, _settings: approvals.deny(store, credential.caller, step_id, note=note, dry_run=dry_run),
    )
    out.reply(reply, human=_human)


@from_table("steps.cancel", steps)
@command
def steps_cancel(
    out: Output, step_id: int, note: str | None, dry_run: bool, credential: Credential, database_url: str | None
) -> None:
    reply = _run(
        database_url,
        lambda store, _settings: approvals.cancel(store, credential.caller, step_id, note=note, dry_run=dry_run),
    )
    out.reply(reply, human=_human)
