"""evq admin demo (formerly `evq demo`)"""

from __future__ import annotations

from dataclasses import asdict

from evq.ops.cli.admin import admin
from evq.ops.cli.common import command, load_settings
from evq.ops.cli.output import Output, table
from evq.ops.cli.table import from_table


@from_table("admin.demo", admin)
@command
def demo(out: Output, data_dir: str | None, database_url: str | None) -> int:
    from evq.worker.extras import needs

    # The demo's loopback SMTP server (aiosmtpd) and its HTTP step (the HTTP adapter's httpx).
    with needs("dev", "evq admin demo"):
        from evq.ops.dev.demo import run_demo

    settings = load_settings(database_url=database_url, data_dir=data_dir, log_level="warning")
    result = run_demo(settings)
    out.success(asdict(result), human=_human)
    return result.worker_exit


def _twice(delivered: dict) -> str:
    twice = sorted(k for k, n in delivered.items() if n > 1)
    if not twice:
        return "each arrived exactly once."
    return f"{len(twice)} arrived more than once: {', '.join(twice)}."


def _human(d: dict) -> str:
    columns = [
        ("id", "step"),
        ("step_id", "name"),
        ("provider", "via"),
        ("to", "to"),
        ("status", "status"),
        ("reason", "reason"),
    ]
    lines = [
        f"evq demo — run {d['run_id']} (database: {d['database']})",
        "",
        table(d["steps"], columns),
        "",
        f"The SMTP server and the HTTP API received {sum(d['delivered'].values())} messages; {_twice(d['delivered'])}",
        f"Enqueueing 'welcome' a second time returned the same step (created: {str(d['repeat_created']).lower()}).",
    ]
    ids = {s["id"] for s in d["steps"]}
    gaps = sorted(set(range(min(ids), max(ids) + 1)) - ids) if ids else []
    if gaps:
        # A reader counting the table sees a number missing and deserves to know why.
        lines.append(
            f"There is no step {', '.join(map(str, gaps))}: that repeat used up the number (PostgreSQL draws\n"
            "the next id before it finds the existing step). Step ids are unique and never reused, not consecutive."
        )
    by_id = {s["id"]: s for s in d["steps"]}
    for step in d["steps"]:
        name = f"Step {step['id']} ({step['step_id']})"
        if step["status"] == "unknown":
            lines += [
                "",
                f"{name} is UNKNOWN: the SMTP server took the message and the connection dropped before its",
                "reply, so nobody can tell whether it was accepted, and SMTP offers no way to ask. evq will not",
                "send it again on its own. An operator checks the server's logs or the mailbox for its Message-ID",
                "and closes it with an audited verdict (closing needs an operator key: see `evq keys create --help`):",
                "    evq steps list --status unknown",
                f"    evq steps show {step['id']}",
                f"    evq runs show {d['run_id']}",
                f"    evq steps resolve {step['id']} --as accepted|rejected|retry --note 'what you checked and found'",
            ]
        elif step["reason"] == "reconciled":
            lines += [
                "",
                f"{name} lost its HTTP response the same way, and the provider's dedupe window here is shorter",
                "than a lease, so a retry could have sent it twice. Instead the reconciler asked the provider for",
                f"the message tagged with the step's key, found {step['provider_message_id']}, and closed the step",
                f"as ACCEPTED with the lookup as evidence (evq steps show {step['id']}).",
            ]
        elif step["status"] == "rejected":
            lines += ["", f"{name} was REJECTED by the server (550): a definite no."]
        elif step["notice_of"] is not None:
            original = by_id.get(step["notice_of"], {"step_id": "?"})
            lines += [
                "",
                f"{name} is the failure notice for step {step['notice_of']} ({original['step_id']}):",
                f"'{step['subject']}' to {', '.join(step['to'])}, the address its request named to be told.",
                f"It is a send of its own, from a sender no caller may use; now {step['status'].upper()}.",
            ]
    return "\n".join(lines)
