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
