"""The benchmark's pieces that its end-to-end run (tests/acceptance/test_bench.py) cannot tell apart
from luck: which evq its worker processes import, and that every mode has its measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import evq
from evq.ops.bench import report
from evq.ops.bench.children import child_environment
from evq.ops.bench.harness import MEASURE
from evq.ops.bench.modes import MODES


def test_worker_processes_import_this_evq_and_nothing_from_inside_it(monkeypatch):
    """Started with the parent's PYTHONPATH unset, a child must still import the evq this process
    runs (not another install's), and no folder inside evq (ops/, whose rooms app, web and cli
    would become top-level modules) may be on its path."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    cwd, env = child_environment()
    probe = "import evq, json, sys; print(json.dumps([evq.__file__, sys.path]))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    child_evq, child_path = json.loads(done.stdout)
    assert Path(child_evq).resolve() == Path(evq.__file__).resolve()
    inside = Path(evq.__file__).resolve().parent
    checkout_ops = inside.parent / "ops"
    assert not [p for p in child_path if p and Path(p).resolve() in (inside / "ops", checkout_ops)]


def test_every_mode_is_measured_in_the_order_evq_bench_lists_them():
    assert tuple(MEASURE) == MODES


def test_the_revision_is_this_checkouts_commit():
    root = Path(evq.__file__).resolve().parent.parent
    head = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
    ).stdout.strip()
    if (root / ".git").exists() and head:
        assert report.git_revision().removesuffix("-dirty") == head
    else:  # a copy without git history (a container build)
        assert report.git_revision() in ("unknown", f"evq {evq.__version__} (installed)")


def test_the_ops_pages_mix_is_exact_and_spread_by_a_permutation():
    """The fill's mix (ops/bench/pagefill.py): every share of the issue, counts that add up to the
    steps, and the per-step status (the SQL's arithmetic) giving exactly those counts, closed and
    unknown steps before the open ones."""
    from collections import Counter

    from evq.ops.bench.pagefill import HEAD, TAIL, Mix, multiplier

    big = Mix.of(1_000_000)
    assert big.counts == {
        "rejected": 20_000,
        "unknown": 10_000,
        "held": 5_000,
        "pending": 10_000,
        "retryable": 5_000,
        "in_flight": 10,
        "accepted": 939_990 + 10_000,
    }
    assert sum(big.counts.values()) == 1_000_000
    for n in (3_000, 7_919 * 3, 12_345):
        mix = Mix.of(n)
        statuses = [mix.status_of(g) for g in range(1, n + 1)]
        assert Counter(statuses) == Counter({s: c for s, c in mix.counts.items() if c})
        start = n - 2 * mix.tail
        assert set(statuses[:start]) <= set(HEAD) and set(statuses[start::2]) <= set(HEAD)
        assert set(statuses[start + 1 :: 2]) <= set(TAIL)
        assert multiplier(mix.head) % mix.head and multiplier(mix.tail) % mix.tail
    # Spread, not bunched: each tenth of the week has its share of rejected steps (2%, give or take).
    mix = Mix.of(100_000)
    tenth = mix.head // 10
    for part in range(10):
        rejected = sum(mix.status_of(g) == "rejected" for g in range(part * tenth + 1, (part + 1) * tenth + 1))
        assert 0.015 < rejected / tenth < 0.025


def test_an_impossible_page_time_fails_loudly_and_a_good_one_is_read():
    """The ops-pages mode's reading of Server-Timing: a missing header, a zero, a negative or a
    word is ImpossibleFigure (the run stops), never a figure that scores as met."""
    import httpx
    import pytest

    from evq.ops.bench.pages import ImpossibleFigure, Measured, Page, percentile, server_ms

    assert server_ms(httpx.Headers({"server-timing": "app;dur=12.34"}), "p") == 12.34
    assert server_ms(httpx.Headers({"server-timing": "db;dur=3, app;dur=7.5"}), "p") == 7.5
    for header in ({}, {"server-timing": "app;dur=0.00"}, {"server-timing": "app;dur=-4"}):
        with pytest.raises(ImpossibleFigure):
            server_ms(httpx.Headers(header), "p")
    for header in ({"server-timing": "app;dur=nan"}, {"server-timing": "app;dur=fast"}, {"server-timing": "db;dur=5"}):
        with pytest.raises(ImpossibleFigure):
            server_ms(httpx.Headers(header), "p")
    runs = [float(v) for v in range(1, 21)]
    assert percentile(runs, 95) == 19.0 and percentile(runs, 50) == 10.0 and percentile([5.0], 95) == 5.0
    row = Measured(Page("list", "/ops/steps"), [*runs[:19], 250.0]).row()
    assert row["p95"] == 19.0 and row["max"] == 250.0 and row["met"] is True
    slow = Measured(Page("list", "/ops/steps"), [150.0] * 18 + [201.0, 300.0]).row()
    assert slow["p95"] == 201.0 and slow["met"] is False
