"""`evq bench --quick -o json` end to end: every mode runs and the report has its shape.

The numbers are not asserted (they depend on the machine and its load); the
shape, the ratios' presence and the revision are.
"""

from __future__ import annotations

import json

import pytest

from evq.ops.bench.harness import MODES
from tests import contract
from tests.acceptance.conftest import Evq


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_bench_runs_every_mode_and_reports_json(evq: Evq, pg_server):
    done = evq.run("bench", "--quick", "-o", "json", timeout=800, EVQ_DATABASE_URL=pg_server)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    contract.check(("bench",), out)
    report = out["data"]
    assert report["revision"]
    assert set(report) == {"revision", "config", "machine", "seconds", "results", "targets", "notes"}
    assert report["config"]["modes"] == list(MODES) and report["config"]["runs"] == 1
    figures = {r["name"]: r for r in report["results"]}
    for r in report["results"]:
        assert set(r) == {"mode", "name", "unit", "median", "min", "max", "runs", "rss_mb", "ratios", "note"}
        assert r["min"] <= r["median"] <= r["max"] and r["runs"]
    modes = {r["mode"] for r in report["results"]}
    # The run says whether it found pgqueuer (the optional `bench` extra); asking importlib here
    # would race with anything installing it while the benchmark runs.
    peer = report["machine"]["peer"] is not None
    assert peer or any("pgqueuer is not installed" in n for n in report["notes"])
    assert modes == set(MODES) - (set() if peer else {"peer"})
    # Every worker process reported its peak RSS.
    assert all(r["rss_mb"] > 0 for r in report["results"] if r["mode"] in ("drain", "latency", "pickup"))
    drain = figures["evq drain, 2 processes"]
    assert drain["ratios"]["ceiling"] > 0
    assert (drain["ratios"]["pgqueuer_best"] is not None) == peer
    assert all(0 < figures[f"evq latency-bound, concurrency {c}"]["ratios"]["ideal"] for c in (50, 200, 500))
    assert figures["metrics collector query"]["unit"] == "ms"
    assert {t["target"] for t in report["targets"]} >= {
        "batch enqueue >= 40,000 steps/s",
        "collector query < 50 ms",
        "drain 1 process / pgqueuer default >= 2",
    }
    assert all(t["met"] in (True, False, None) for t in report["targets"])


def test_bench_refuses_bad_flags_in_the_contract(evq: Evq):
    out = evq.json("bench", "--mode", "nonsense", expect=2)
    assert out["error"]["code"] == "E_INVALID_ARG"
