"""The redactor: content retention (EVQ_KEEP_CONTENT), part of every worker's housekeeping.

A message body is needed while the send may still happen: a retry, an unknown row an
operator checks and may send again, a dead-letter requeue. Once a step is closed
(accepted or rejected) and ``keep`` has passed, the body is only a copy of what an
agent wrote to a person. The redactor replaces the text and html of such steps with
their sizes and SHA-256 and keeps everything that proves the send: headers,
recipients, subject, Message-ID, key, ``payload_sha256`` and every evidence row, plus
a ``content_redacted`` row of its own.

Safety is the database's, not this loop's: the work happens inside
``evq_redact_batch`` (migrations/baseline/prune.sql), which takes only closed
steps past the cutoff on the database's clock, each once (``content_redacted_at``),
with SKIP LOCKED so every worker can run a redactor. Each batch is one statement, so
a crash leaves whole batches done and the rest untouched, and the next pass goes on.
A redacted step can never be reopened (the trigger of the same migration).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from evq.worker import metrics
from evq.worker.errors import ConfigError
from evq.worker.ports import RedactStore
from evq.worker.records import RedactCounts


@dataclass(frozen=True, slots=True)
class RedactorConfig:
    keep: timedelta = timedelta(days=30)
    batch: int = 500
    # Content kept "0" after close goes within about this many seconds.
    interval: float = 60.0

    def validate(self) -> RedactorConfig:
        if self.keep < timedelta(0) or self.batch < 1 or self.interval <= 0:
            raise ConfigError(f"invalid redactor config: {self}")
        return self


class Redactor:
    name = "redactor"

    def __init__(self, store: RedactStore, config: RedactorConfig, *, actor: str = "redactor"):
        self.store = store
        self.config = config.validate()
        self.interval = config.interval
        self.actor = actor

    async def run_once(self) -> RedactCounts:
        """Redact batch after batch until a batch comes back short: nothing more is due now."""
        total = RedactCounts()
        while True:
            counts = await self.store.redact_content(keep=self.config.keep, limit=self.config.batch, actor=self.actor)
            total = RedactCounts(redacted=total.redacted + counts.redacted, batches=total.batches + 1)
            metrics.REDACTED.inc(counts.redacted)
            if counts.redacted < self.config.batch:
                return total
