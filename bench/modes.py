"""The benchmark's modes, in the order `evq bench` runs them: here, not in bench/harness.py (whose
MEASURE table names each mode's function), so the CLI can list them (`--mode`, `evq schema`)
without importing the benchmark and psycopg."""

from __future__ import annotations

MODES = ("drain", "latency", "enqueue", "pickup", "scale", "ceiling", "peer", "ops-pages", "retention")
# What a run without --mode measures: ops-pages and retention only when asked for (each fills a
# database of its own, a million steps or ten million evidence rows: minutes, and a question of
# its own, the operators' page and retention at scale).
DEFAULT_MODES = tuple(m for m in MODES if m not in ("ops-pages", "retention"))
