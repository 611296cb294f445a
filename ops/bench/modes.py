"""The benchmark's modes, in the order `evq bench` runs them: here, not in ops/bench/harness.py (whose
MEASURE table names each mode's function), so the CLI can list them (`--mode`, `evq schema`)
without importing the benchmark and psycopg."""

from __future__ import annotations

MODES = ("drain", "latency", "enqueue", "pickup", "scale", "ceiling", "peer")
