"""The queue sampler (issue 18): once a minute, the queue's figures into ``queue_samples``,
what the overview's "better or worse?" line is drawn from.

Every worker runs one, and so does `evq serve`, so the history goes on when no worker runs
(which is exactly when lag grows). Many processes make one row a minute: the first writer
of a minute wins and the others write nothing (the store's ``sample_queue``), and each
write also deletes the minutes older than :data:`~evq.worker.window.KEEP_SAMPLES`. The same
tick rolls up the sends of the complete minutes (the store's ``roll_up_sends``), which the
sends chart reads instead of every evidence row.

A sample that cannot be written is a gap in a chart, never a stopped worker: the first
failure of a run of them is logged at warning, the rest are not (a database down for an
hour would otherwise log sixty), and the first success after them says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from evq.worker.errors import EvqError
from evq.worker.logs import get_logger
from evq.worker.ports import SampleStore
from evq.worker.window import KEEP_SAMPLES

log = get_logger("evq.sampler")

SAMPLE_SECONDS = 60.0


@dataclass(slots=True)
class SampleResult:
    written: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        # Nothing for run_periodically to log every minute: a sample is routine.
        return 0


class QueueSampler:
    name = "queue_sampler"

    def __init__(self, store: SampleStore, *, sampled_by: str, keep_seconds: float = KEEP_SAMPLES):
        self.store = store
        self.sampled_by = sampled_by
        self.keep_seconds = keep_seconds
        self.failing = False
        self.interval = _until_next_minute()

    async def run_once(self) -> SampleResult:
        self.interval = _until_next_minute()
        try:
            written = await self.store.sample_queue(self.sampled_by, keep_seconds=self.keep_seconds)
            # The charts' per-minute send counts ride on the same minute tick (one writer wins).
            await self.store.roll_up_sends(keep_seconds=self.keep_seconds)
        except EvqError as exc:
            if not self.failing:
                log.warning("queue_sample_failed", error=exc.message, note="the overview's charts show a gap")
            self.failing = True
            return SampleResult(failed=1)
        except Exception:
            if not self.failing:
                log.warning("queue_sample_failed", exc_info=True, note="the overview's charts show a gap")
            self.failing = True
            return SampleResult(failed=1)
        if self.failing:
            log.info("queue_sample_resumed")
        self.failing = False
        return SampleResult(written=int(written))


def _until_next_minute() -> float:
    # A few seconds into the next minute rather than a flat 60 s, so one process's jittered
    # passes (worker/service.py) do not skip a minute now and then: a gap in the chart.
    return SAMPLE_SECONDS - time.time() % SAMPLE_SECONDS + 5
