"""evq steps list | show"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import click

from ops import wiring
from ops.cli.common import command, database_option, load_settings, output_option, run
from ops.cli.output import Output, age, table
from worker.errors import InvalidRequest
from worker.ports import StepFilter
from worker.states import Status

_DURATION = re.compile(r"^(\d+)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise InvalidRequest([{"field": "--older-than", "message": f"expected a duration like 30m, 2h or 3d, got {text!r}"}])
    return timedelta(seconds=int(match[1]) * _UNITS[match[2]])


@click.group("steps")
def steps() -> None:
    """Read back email steps: their state, decision and evidence."""


@steps.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in Status]), help="Only these states; repeatable.")
@click.option("--run-id", default=None, help="Only this run.")
@click.option("--provider", default=None, help="Only this provider.")
@click.option("--older-than", default=None, metavar="30m|2h|3d", help="Only rows older than this (unknown rows: since they became unknown).")
@click.option("--recipient-domain", default=None, help="Only rows with a recipient at this domain.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True)
@output_option
@database_option
@command
def steps_list(
    out: Output,
    statuses: tuple[str, ...],
    run_id: str | None,
    provider: str | None,
    older_than: str | None,
    recipient_domain: str | None,
    limit: int,
    offset: int,
    database_url: str | None,
) -> None:
    """List steps: unknown ones oldest first, the rest newest first."""
    settings = load_settings(database_url=database_url)
    # Relative filters are fixed once, at the start.
    now = datetime.now(timezone.utc)
    where = StepFilter(
        statuses=tuple(Status(s) for s in statuses),
        run_id=run_id,
        provider=provider,
        created_before=now - parse_duration(older_than) if older_than else None,
        recipient_domain=recipient_domain,
        limit=limit,
        offset=offset,
    )

    async def fetch() -> tuple[list[Any], int]:
        async with wiring.open_store(settings, max_size=1) as store:
            return await store.list_steps(where, now=now)

    rows, total = run(fetch())
    data = [_summary(r) for r in rows]
    out.success(
        data,
        human=lambda d: table(
            d,
            [("id", "id"), ("status", "status"), ("age", "age"), ("run_id", "run"), ("step_id", "step"),
             ("provider", "provider"), ("attempts", "tries"), ("recipients", "to"), ("subject", "subject"),
             ("reason", "reason")],
        )
        + (f"\n{len(d)} of {total}" if d else ""),
        meta={"count": len(data), "total": total, "limit": limit, "offset": offset},
    )


def _summary(r: Any) -> dict[str, Any]:
    return {
        "id": r.id,
        "run_id": r.run_id,
        "step_id": r.step_id,
        "status": str(r.status),
        "reason": r.reason,
        "provider": r.provider,
        "attempts": r.attempts,
        "recipients": r.recipients,
        "subject": r.subject,
        "created_at": r.created_at,
        "updated_at": r.updated_at,
        "unknown_since": r.unknown_since,
        "closed_at": r.closed_at,
        "age_seconds": r.age_seconds,
        "age": age(r.age_seconds),
    }


@steps.command("show")
@click.argument("step_id", type=int)
@output_option
@database_option
@command
def steps_show(out: Output, step_id: int, database_url: str | None) -> None:
    """Show one step: the decision behind it, the request, and every evidence row in order."""
    settings = load_settings(database_url=database_url)

    async def fetch() -> Any:
        async with wiring.open_store(settings, max_size=1) as store:
            return await store.get_step(step_id)

    detail = run(fetch())
    data = {"step": _public_step(detail.step), "decision": detail.decision, "evidence": detail.evidence}
    out.success(data, human=_human_detail)


_HIDDEN = ("lease_token",)


def _public_step(step: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k not in _HIDDEN}


def _human_detail(d: dict[str, Any]) -> str:
    s, dec = d["step"], d["decision"] or {}
    p = s["payload"]
    to = ", ".join(a["email"] for a in p["to"])
    lines = [
        f"step {s['id']}  {s['status'].upper()}" + (f" ({s['reason']})" if s.get("reason") else ""),
        f"  run / step      {s['run_id']} / {s['step_id']}",
        f"  key             {s['idempotency_key']}",
        f"  message-id      {s['message_id']}",
        f"  provider        {s['provider']}  attempts {s['attempts']}"
        + (f"  provider id {s['provider_message_id']}" if s.get("provider_message_id") else ""),
        f"  from / to       {p['from']['email']} -> {to}",
        f"  subject         {p['subject']}",
    ]
    if s.get("detail"):
        lines.append(f"  detail          {s['detail']}")
    lines += [
        "decision",
        f"  intent          {dec.get('intent') or '-'}",
        f"  model / tool    {dec.get('model') or '-'} / {dec.get('tool') or '-'}",
        f"  instructions    {dec.get('instruction_version') or '-'}  prompt {dec.get('prompt_version') or '-'}",
        f"  decided at      {dec.get('decided_at') or '-'}",
        "evidence",
    ]
    rows = [
        {
            "at": e["created_at"],
            "kind": e["kind"],
            "attempt": e["attempt"],
            "change": f"{e['from_status'] or ''} -> {e['to_status'] or '(none)'}" if e["from_status"] else e["to_status"],
            "outcome": e["outcome"],
            "actor": e["actor"],
            "note": (e["detail"] or {}).get("message") or (e["detail"] or {}).get("reply") or e["reason"],
        }
        for e in d["evidence"]
    ]
    lines.append(table(rows, [("at", "at"), ("kind", "kind"), ("attempt", "try"), ("change", "state"),
                              ("outcome", "outcome"), ("actor", "actor"), ("note", "note")]))
    if s["status"] == "unknown":
        lines.append(
            "\nThis send may or may not have reached the provider. Check the provider's logs or the "
            f"recipient's mailbox for Message-ID {s['message_id']}, then close it with an audited verdict."
        )
        lookups = [e for e in d["evidence"] if e["kind"] == "reconciled" and not (e["detail"] or {}).get("found")]
        if lookups:
            last = lookups[-1]
            lines.append(
                f"The reconciler asked the provider {len(lookups)} time(s), last at {last['created_at']}: it has no "
                "message with this step's key. Absence is not proof that it was not sent."
            )
    return "\n".join(lines)
