"""The partition keeper: evidence partitions made ahead of the steps that will need them.

Evidence is partitioned by its step's id (migrations/baseline/partitions.sql), each partition a range of
``EVQ_EVIDENCE_PARTITION_STEPS`` ids. Once a minute every worker asks the store to keep
four partitions beyond the newest step; the first to ask makes them, the others find
nothing to do. Falling behind loses nothing: evidence no partition covers lands in the
overflow partition, and the next partition starts above it. Making one waits at most a
couple of seconds for its lock (a slow reader of evidence), then gives up until the next
minute, rather than stalling every writer queued behind it.
"""

from __future__ import annotations

from dataclasses import dataclass

from evq.worker.ports import PruneStore

KEEP_SECONDS = 60.0


@dataclass(slots=True)
class KeptPartitions:
    made: int = 0

    @property
    def total(self) -> int:
        # run_periodically logs a pass with a total: only one that made a partition.
        return self.made


class PartitionKeeper:
    name = "partition_keeper"

    def __init__(self, store: PruneStore, *, steps: int, interval: float = KEEP_SECONDS):
        if steps < 1:
            raise ValueError("an evidence partition holds at least one step id")
        self.store = store
        self.steps = steps
        self.interval = interval

    async def run_once(self) -> KeptPartitions:
        return KeptPartitions(made=await self.store.evidence_partitions_ahead(self.steps))
