"""The benchmark's modes, in the order `evq bench` runs them: here, not in ops/bench/harness.py (whose
MEASURE table names each mode's function), so the CLI can list them (`--mode`, `evq schema`)
without importing the benchmark and psycopg."""

from __future__ import annotations

MODES = ("drain", "latency", "enqueue", "pickup", "scale", "ceiling", "peer", "ops-pages")
# What a run without --mode measures: ops-pages only when asked for (it fills a database of its
# own with a million steps: minutes, and a question of its own, the operators' page).
DEFAULT_MODES = tuple(m for m in MODES if m != "ops-pages")
