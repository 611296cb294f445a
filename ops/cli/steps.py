"""evq steps list | show | resolve (enqueue and prune: ops/cli/enqueue.py, ops/cli/prune.py)"""

from __future__ import annotations

from typing import Any

from evq.ops import wiring
from evq.ops.app import service
from evq.ops.app.service import Caller
from evq.ops.app.waiting import parse_wait, wait_step
from evq.ops.cli.auth import Credential
from evq.ops.cli.common import command, load_settings, run
from evq.ops.cli.output import EXIT_CODES, Output, age, table
from evq.ops.cli.table import from_table, table_group
from evq.worker.logs import register_secrets
from evq.worker.resolution import Resolution

steps = table_group("steps")


@from_table("steps.list", steps)
@command
def steps_list(
    out: Output, statuses: tuple[str, ...], limit: int, offset: int, database_url: str | None, **filters: Any
) -> None:
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.list_steps(
                store,
                Caller(None, trusted_reader=True),
                statuses=statuses,
                filters=filters,
                limit=limit,
                offset=offset,
                unresolvable=settings.policy().unresolvable,
            )

    reply = run(fetch())
    # A total past the count's cap says so: "10,000+" (docs/design.md, "Search").
    total = f"{reply.meta['total']:,}" + ("" if reply.meta["total_exact"] else "+")
    out.reply(
        reply,
        human=lambda d: (
            _summary_table(d) + (f"\n{len(d)} of {total}" if d else f"\n(0 of {total})" if total != "0" else "")
        ),
    )


def delivery_text(delivery: dict[str, Any] | None) -> str:
    """A step's latest delivery state in a word or three: ``delivered 2026-...`` or ``-``."""
    return f"{delivery['state']} {delivery['at']}" if delivery else "-"


def _summary_table(rows: list[dict[str, Any]], *extra: tuple[str, str]) -> str:
    shown = [
        {**r, "age": age(r["age_seconds"]), "delivered": (r.get("delivery") or {}).get("state", "-")} for r in rows
    ]
    if any("delivery" in r for r in rows):
        extra = (("delivered", "delivery"), *extra)
    return table(
        shown,
        [
            ("id", "id"),
            ("status", "status"),
            ("age", "age"),
            ("run_id", "run"),
            ("step_id", "step"),
            ("provider", "provider"),
            ("attempts", "tries"),
            ("recipients", "to"),
            ("subject", "subject"),
            ("reason", "reason"),
            ("next_action", "next"),
            *extra,
        ],
    )


@from_table("steps.show", steps)
@command
def steps_show(out: Output, step_id: int, content_key: str | None, database_url: str | None) -> None:
    register_secrets([content_key])  # before anything can log it
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.show_step(
                store, Caller(content_key, trusted_reader=True), step_id, unresolvable=settings.policy().unresolvable
            )

    out.reply(run(fetch()), human=_human_detail)


@from_table("steps.wait", steps)
@command
def steps_wait(out: Output, step_id: int, timeout: str, content_key: str | None, database_url: str | None) -> None:
    register_secrets([content_key])  # before anything can log it
    seconds = parse_wait(timeout)  # a bad value is refused before the database is opened
    settings = load_settings(database_url=database_url)

    async def fetch() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await wait_step(
                store,
                Caller(content_key, trusted_reader=True),
                step_id,
                timeout=seconds,
                unresolvable=settings.policy().unresolvable,
            )

    reply = run(fetch())
    waited = lambda d: ("(timed out: still in progress)\n" if reply.meta.get("timed_out") else "") + _human_detail(d)  # noqa: E731
    out.reply(reply, human=waited)


def evidence_line(e: dict[str, Any]) -> dict[str, Any]:
    """One evidence row as a table line: what changed, and the words that explain it."""
    detail = e.get("detail") or {}
    change = f"{e['from_status'] or ''} -> {e['to_status'] or '(none)'}" if e.get("from_status") else e.get("to_status")
    return {
        "at": e["at"] if "at" in e else e["created_at"],
        "kind": e["kind"],
        "attempt": e.get("attempt"),
        "change": change,
        "outcome": e.get("outcome"),
        "actor": e.get("actor"),
        "note": detail.get("note") or detail.get("message") or detail.get("reply") or e.get("reason"),
    }


EVIDENCE_COLUMNS = [
    ("at", "at"),
    ("kind", "kind"),
    ("attempt", "try"),
    ("change", "state"),
    ("outcome", "outcome"),
    ("actor", "actor"),
    ("note", "note"),
]


def _content_line(c: dict[str, Any]) -> str:
    sizes = ", ".join(f"{name} {part['bytes']} bytes" for name, part in (c.get("parts") or {}).items() if part)
    if c.get("shown"):
        return f"{sizes} (shown with -o json)"
    return f"{sizes}; not shown: {c.get('note')}"


def _asked_by(decision: dict[str, Any]) -> str:
    """Who enqueued the send: the key's name and public id, and the interface."""
    if not decision.get("interface"):
        return "-"
    key = f" (key evq_{decision['actor_key_id']})" if decision.get("actor_key_id") else " (no key)"
    return f"{decision.get('actor') or '-'}{key} via {decision['interface']}"


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
        f"  content         {_content_line(s.get('content') or {})}",
        f"  delivery        {delivery_text(s.get('delivery'))}"
        + (f"  ({s['delivery']['events']} webhook events)" if s.get("delivery") else ""),
        f"  next action     {s.get('next_action_label') or s.get('next_action')}"
        + ("  (safe to send again)" if s.get("safe_to_retry") else ""),
    ]
    if s.get("detail"):
        lines.append(f"  detail          {s['detail']}")
    for i, r in enumerate(s.get("refused_recipients") or ()):
        code = r["code"] if r["code"] is not None else "not sent"
        lines.append(f"  {'refused' if i == 0 else '':<15} {r['recipient']}: {code} {r['reply']}".rstrip())
    lines += [
        "decision",
        f"  intent          {dec.get('intent') or '-'}",
        f"  model / tool    {dec.get('model') or '-'} / {dec.get('tool') or '-'}",
        f"  instructions    {dec.get('instruction_version') or '-'}  prompt {dec.get('prompt_version') or '-'}",
        f"  decided at      {dec.get('decided_at') or '-'}",
        f"  asked by        {_asked_by(dec)}",
        "evidence",
        table([evidence_line(e) for e in d["evidence"]], EVIDENCE_COLUMNS),
    ]
    if d.get("deliveries"):
        lines += [
            "delivery events (newest first)",
            table(
                [
                    {**e, "when": e["occurred_at"] or e["received_at"], "to": e["recipient"] or "-"}
                    for e in d["deliveries"]
                ],
                [("id", "id"), ("when", "when"), ("provider", "provider"), ("type", "type"), ("to", "recipient")],
            ),
        ]
    if s["status"] == "unknown":
        lines.append(
            "\nThis send may or may not have reached the provider. Check the provider's logs or the "
            f"recipient's mailbox for Message-ID {s['message_id']}, then close it with an audited verdict:\n"
            f"    evq steps resolve {s['id']} --as accepted|rejected|retry --note 'what you checked and found'"
        )
        lookups = [e for e in d["evidence"] if e["kind"] == "reconciled" and not (e["detail"] or {}).get("found")]
        if lookups:
            last = lookups[-1]
            lines.append(
                f"The reconciler asked the provider {len(lookups)} time(s), last at {last['created_at']}: it has no "
                "message with this step's key. Absence is not proof that it was not sent."
            )
    return "\n".join(lines)


@from_table("steps.resolve", steps)
@command
def steps_resolve(
    out: Output,
    step_id: int | None,
    verdict: str,
    note: str,
    reason: str | None,
    provider_message_id: str | None,
    evidence_url: str | None,
    statuses: tuple[str, ...],
    limit: int | None,
    max_failures: int | None,
    dry_run: bool,
    credential: Credential,
    database_url: str | None,
    **filters: Any,
) -> int:
    resolution = Resolution.parse(
        verdict, note, reason=reason, provider_message_id=provider_message_id, evidence_url=evidence_url
    )
    selection = service.Selection(
        step_id=step_id, statuses=statuses, filters=filters, limit=limit, max_failures=max_failures
    )
    selection.check()
    settings = load_settings(database_url=database_url)

    async def work() -> service.Reply:
        async with wiring.open_store(settings, max_size=1) as store:
            return await service.resolve(
                store,
                credential.caller,
                resolution,
                selection,
                default_max_attempts=settings.max_attempts,
                dry_run=dry_run,
                signals=True,
                unresolvable=settings.policy().unresolvable,
            )

    reply = run(work())
    out.reply(reply, human=_human_plan if dry_run else _human_results)
    return EXIT_CODES["E_PARTIAL_FAILURE"] if reply.status == "partial_failure" else 0


def _human_plan(d: dict[str, Any]) -> str:
    n = len(d["steps"])
    return (
        _summary_table(d["steps"], ("to_status", "would become"))
        + f"\ndry run: {n} row{'s' * (n != 1)} would become {d['to_status']}; nothing was changed"
    )


def _human_results(d: dict[str, Any]) -> str:
    lines = []
    for r in d["results"]:
        if r["outcome"] == "succeeded":
            raised = f"  (max attempts raised to {r['max_attempts']})" if r.get("max_attempts_raised") else ""
            lines.append(f"step {r['id']}: unknown -> {r['to_status']}  evidence {r['evidence_id']}{raised}")
        else:
            lines.append(f"step {r['id']}: FAILED {r['error']['code']}: {r['error']['message']}")
    lines.append(f"{d['succeeded']} resolved, {d['failed']} failed")
    return "\n".join(lines)
