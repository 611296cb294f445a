"""The command groups: one line each for `evq schema` and `evq GROUP --help`, and when to use each."""

from __future__ import annotations

# The groups' one line each, for `evq schema` and `evq GROUP --help`.
GROUPS: dict[str, str] = {
    "admin": "Run and look after an installation: its health, the database schema, the HTTP and MCP servers, the demo, "
    "the benchmark.",
    "deliveries": "What providers' webhooks said became of each message: delivered, deferred, bounced, complained.",
    "events": "Each API key's event feed: every rejection, unknown and operator verdict on the sends it enqueued.",
    "keys": "Manage API keys: who may change rows, and the name evidence records them by.",
    "policy": "The approval policy: which sends wait for a person, and the blast-radius budgets.",
    "providers": "The email providers evq sends through, and their circuits.",
    "refusals": "Enqueues evq refused: what agents asked, by which key, and every failing field.",
    "runs": "Read back an agent run: every step it decided, and everything that happened to each.",
    "schema": "Describe evq's commands for scripts and agents, a level at a time.",
    "steps": "Email steps: enqueue a send, read back (or wait for) its state and evidence, close unknown ones, "
    "prune old ones.",
    "worker": "Run the worker that sends queued email.",
}
# When an agent should pick each group and when another (`evq schema`'s products: the schema
# contract's routing, as each command's use_when / avoid_when is for its tools).
GROUP_WHEN: dict[str, tuple[str, str]] = {
    "admin": (
        "setting up or looking after an installation: its health first, the database schema, the servers",
        "working with sends: `steps` has them",
    ),
    "deliveries": (
        "what a provider's webhook said became of a message after it was accepted: delivered, bounced, complained",
        "whether evq sent a message: `steps show` has the step's own state",
    ),
    "events": (
        "an agent catching up on every send of its own that was rejected, became unknown or got a verdict",
        "waiting on one send: `steps wait` answers when it is worth acting on",
    ),
    "keys": (
        "an administrator giving a holder its own API key, revoking one, or pointing a key's failures somewhere",
        "an agent's run: keys are managed where the database is, never over HTTP or MCP",
    ),
    "policy": (
        "before a batch: which sends will wait for a person, and how much of each budget is left",
        "why one send is held: `steps show` has its hold",
    ),
    "providers": (
        "sends are not going out, or before a batch: is a provider down, and can it settle a lost answer?",
        "one send's state: `steps show`",
    ),
    "refusals": (
        "finding out what an agent asked for and why evq refused it",
        "sends that were accepted and then failed: `steps list` and `events list` have those",
    ),
    "runs": (
        "auditing an agent run: every step it decided and what became of each",
        "following one send: `steps show` is shorter",
    ),
    "schema": (
        "before calling a command: what it takes, what it prints, what it may change",
        "doing the work itself: the other products' tools do it",
    ),
    "steps": (
        "an agent sending an email and following it, or an operator approving, denying or closing sends",
        "sending again a step that is held or unknown: wait, or ask an operator",
    ),
    "worker": (
        "running the installation: workers are what send queued email",
        "with a real provider configured on a test database: it sends what is queued",
    ),
}
assert set(GROUP_WHEN) == set(GROUPS), "every group says when to use it and when not"
