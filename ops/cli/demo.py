"""evq demo"""

from __future__ import annotations

from dataclasses import asdict

import click

from ops.cli.common import command, database_option, load_settings, output_option
from ops.cli.output import Output, table


@click.command("demo")
@click.option("--data-dir", default=None, help="Folder for the embedded PostgreSQL [env: EVQ_DATA_DIR].")
@output_option
@database_option
@command
def demo(out: Output, data_dir: str | None, database_url: str | None) -> int:
    """Show evq end to end on this machine: starts the database (embedded unless
    EVQ_DATABASE_URL is set) and an SMTP server on loopback, enqueues five sends —
    one whose reply is lost, one the server refuses — runs the worker until the
    queue is drained, and explains what happened."""
    from ops.demo import run_demo

    settings = load_settings(database_url=database_url, data_dir=data_dir, log_level="warning")
    result = run_demo(settings)
    out.success(asdict(result), human=_human)
    return result.worker_exit


def _human(d: dict) -> str:
    lines = [
        f"evq demo — run {d['run_id']} (database: {d['database']})",
        "",
        table(d["steps"], [("id", "step"), ("step_id", "name"), ("to", "to"), ("status", "status"), ("reason", "reason")]),
        "",
        f"The SMTP server received {sum(d['delivered'].values())} messages; "
        f"none twice: {all(n == 1 for n in d['delivered'].values())}.",
        f"Enqueueing 'welcome' a second time returned the same step (created: {str(d['repeat_created']).lower()}).",
    ]
    for step in d["steps"]:
        if step["status"] == "unknown":
            lines += [
                "",
                f"Step {step['id']} ({step['step_id']}) is UNKNOWN: the server took the message and the connection",
                "dropped before its reply, so nobody can tell whether it was accepted. evq will not send it again",
                "on its own. An operator checks the provider's logs or the mailbox for its Message-ID and closes it",
                "with an audited verdict (closing needs an operator key: see `evq keys create --help`):",
                "    evq steps list --status unknown",
                f"    evq steps show {step['id']}",
                f"    evq runs show {d['run_id']}",
                f"    evq steps resolve {step['id']} --as accepted|rejected|retry --note 'what you checked and found'",
            ]
        if step["status"] == "rejected":
            lines += ["", f"Step {step['id']} ({step['step_id']}) was REJECTED by the server (550): a definite no."]
    return "\n".join(lines)
