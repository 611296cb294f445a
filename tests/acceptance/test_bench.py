"""`evq bench --quick -o json` end to end: every mode runs and the report has its shape.

The numbers are not asserted (they depend on the machine and its load); the
shape, the ratios' presence and the revision are. The drains run 500 steps (--steps; --quick
alone runs 2,000): every figure is still measured and refused if it cannot be right (bench/config.py,
ImpossibleFigure), each worker still claims several batches of 100, and the two runs take less
(the peers' drains, DBOS's at a few hundred workflows a second, scale with N: 117 s and 42 s
before, 89 s and 19 s after, on a loaded 2-core machine).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from bench.modes import DEFAULT_MODES
from tests import contract
from tests.acceptance.conftest import Evq

STEPS = 500


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_bench_runs_every_mode_and_reports_json(evq: Evq, pg_server):
    done = evq.run("bench", "--quick", "--steps", str(STEPS), "-o", "json", timeout=800, EVQ_DATABASE_URL=pg_server)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    contract.check(("bench",), out)
    report = out["data"]
    assert report["revision"]
    assert set(report) == {"revision", "config", "machine", "seconds", "results", "targets", "notes"}
    assert report["config"]["modes"] == list(DEFAULT_MODES) and report["config"]["runs"] == 1
    assert report["config"]["steps"] == STEPS
    figures = {r["name"]: r for r in report["results"]}
    for r in report["results"]:
        assert set(r) == {"mode", "name", "unit", "median", "min", "max", "runs", "rss_mb", "ratios", "note"}
        assert r["min"] <= r["median"] <= r["max"] and r["runs"]
    modes = {r["mode"] for r in report["results"]}
    # The peers are the bench extra's, not the tests': the run finds them exactly when installed.
    peer = report["machine"]["peer"] is not None
    assert peer == (importlib.util.find_spec("pgqueuer") is not None), report["notes"]
    assert modes == set(DEFAULT_MODES)
    # Every worker process reported its peak RSS (the per-step database figures and spawn to
    # first claim are not a worker's throughput or latency).
    timed = [
        r for r in report["results"] if r["mode"] in ("drain", "latency", "pickup") and r["unit"] in ("steps/s", "ms")
    ]
    assert timed and all(r["rss_mb"] > 0 for r in timed)
    # Issue 31's figures: spawn to first claim, and the drain's cost per step in the database.
    assert figures["evq spawn to first claim"]["median"] > 0
    assert (figures["evq spawn to first claim"]["ratios"].get("pgqueuer_spawn") is not None) == peer
    for processes in ("1 process", "2 processes"):
        assert figures[f"evq drain, {processes}: WAL per step"]["median"] > 0
        assert figures[f"evq drain, {processes}: index entries written per step"]["median"] > 0
    drain = figures["evq drain, 2 processes"]
    assert drain["ratios"]["ceiling"] > 0
    assert (drain["ratios"]["pgqueuer_best"] is not None) == peer
    assert all(0 < figures[f"evq latency-bound, concurrency {c}"]["ratios"]["ideal"] for c in (50, 200, 500))
    assert figures["metrics collector query"]["unit"] == "ms"
    assert figures["evq single enqueue p50 (own transaction)"]["median"] > 0
    assert {t["target"] for t in report["targets"]} >= {
        "batch enqueue / pgqueuer batch >= 0.8",
        "collector query < 50 ms",
        "drain 1 process / pgqueuer default >= 1.5",
        "drain 2 processes / pgqueuer best >= 0.7",
        "single enqueue p50 / pgqueuer single p50 <= 1.2",
        "worker RSS at concurrency 500 <= 100 MB",
        "drain with 20,000 terminal rows present / empty-table drain >= 0.95",
    }
    assert all(t["met"] in (True, False, None) for t in report["targets"])
    if peer:
        check_peer_figures(report)
        assert figures["evq single enqueue p50 (own transaction)"]["ratios"]["pgqueuer_single_p50"] > 0


def check_peer_figures(report: dict) -> None:
    """The peers a user would compare with, each round alternated with evq's drain: pgqueuer bare
    and with evidence rows, and DBOS Transact when installed (else a note says why not)."""
    figures = {r["name"]: r for r in report["results"]}
    dbos = report["machine"]["dbos"]
    assert dbos is not None or any("dbos is not installed" in n for n in report["notes"])
    for key, processes, setting in (("default", "1 process", "1 process, batch 10"), ("best", "2 processes", None)):
        paired = figures[f"evq drain, {processes}, alternated with the peers"]
        names = [
            f"pgqueuer drain, {key} (",
            f"pgqueuer with evidence drain, {key} (",
            *([f"DBOS Transact drain, {key} ("] if dbos else []),
        ]
        for prefix in names:
            name = next(n for n in figures if n.startswith(prefix))
            assert setting is None or setting in name or "DBOS" in name
            fig = figures[name]
            assert fig["mode"] == "peer" and fig["median"] > 0 and fig["rss_mb"] > 0
            assert len(fig["runs"]) == len(paired["runs"]) == report["config"]["runs"]
            assert fig["ratios"]["evq"] > 0
        assert paired["ratios"][f"pgqueuer_evidence_{key}"] > 0
        assert (paired["ratios"].get(f"dbos_{key}") is not None) == bool(dbos)
    assert figures["pgqueuer single enqueue p50"]["unit"] == "ms"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_peer_mode_measures_every_peer_alternated_with_evq(evq: Evq, pg_server):
    """`--quick --mode peer` alone (the peers' figures without the other modes): each peer's drain
    beside evq's own in the same round, the targets the peer mode can answer scored, the others n/a."""
    done = evq.run(
        "bench",
        "--quick",
        "--steps",
        str(STEPS),
        "--mode",
        "peer",
        "-o",
        "json",
        timeout=500,
        EVQ_DATABASE_URL=pg_server,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    contract.check(("bench",), out)
    report = out["data"]
    # The test extra installs the peers: a run without them is a broken install, not a skip.
    assert report["machine"]["peer"] is not None, report["notes"]
    assert report["machine"]["dbos"] is not None, report["notes"]
    check_peer_figures(report)
    targets = {t["target"]: t for t in report["targets"]}
    assert targets["drain 2 processes / pgqueuer best >= 0.7"]["met"] in (True, False)
    assert targets["drain 1 process / pgqueuer default >= 1.5"]["met"] in (True, False)
    assert targets["collector query < 50 ms"]["met"] is None


def test_bench_refuses_bad_flags_in_the_contract(evq: Evq):
    out = evq.json("bench", "--mode", "nonsense", expect=2)
    assert out["error"]["code"] == "E_INVALID_ARG"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ops_pages_mode_reads_every_page_and_reports_its_server_time(evq: Evq, pg_server):
    """`--mode ops-pages` at 3,000 steps: the table's shape, every page of today's /ops read
    (those not built yet named in the notes), and every figure a positive server time."""
    done = evq.run(
        "bench",
        "--mode",
        "ops-pages",
        "--steps",
        "3000",
        "--repeat",
        "2",
        "-o",
        "json",
        timeout=500,
        EVQ_DATABASE_URL=pg_server,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    contract.check(("bench",), out)
    report = out["data"]
    pages = report["pages"]
    assert pages["steps"] == 3000 and pages["repeat"] == 2 and pages["target_ms"] == 200
    assert sum(pages["mix"].values()) == 3000 and pages["mix"]["unknown"] == 30
    assert pages["fill_seconds"] > 0 and pages["database_bytes"] > 1_000_000
    rows = {r["page"]: r for r in pages["rows"]}
    # The pages every revision has; the others are measured or said to be missing.
    assert {"overview", "step", "trace", "held", "unknown, provider smtp", "bulk preview (unknown, smtp)"} <= set(rows)
    for r in rows.values():
        assert 0 < r["p50"] <= r["p95"] <= r["max"] and r["met"] == (r["p95"] < 200), r
    figures = [f for f in report["results"] if f["mode"] == "ops-pages"]
    assert len(figures) == len(rows) and all(len(f["runs"]) == 2 and min(f["runs"]) > 0 for f in figures)
    targets = [t for t in report["targets"] if t["target"].startswith("ops page ")]
    assert len(targets) == len(rows) and all(t["met"] in (True, False) for t in targets)
    skipped = [n for n in report["notes"] if n.startswith("ops-pages: ")]
    assert len(rows) + len(skipped) == 22  # every page of the list: read, or said why not
    table = evq.run(
        "bench", "--mode", "ops-pages", "--steps", "3000", "--repeat", "1", timeout=500, EVQ_DATABASE_URL=pg_server
    )
    assert table.returncode == 0, table.stderr[-3000:]
    header = next(line for line in table.stdout.splitlines() if line.startswith("page "))
    assert header.split() == ["page", "p50", "ms", "p95", "ms", "max", "ms", "target"]
    assert "ops pages: 3,000 steps filled in" in table.stdout


@pytest.mark.slow
def test_quick_retention_mode_drops_partitions_and_keeps_every_open_steps_evidence(evq: Evq, pg_server):
    """`--mode retention --quick`: a small fill over many evidence partitions, pruned by the real
    Pruner. The mode itself refuses to report when a kept step (unknown, closed recently) lost a
    row or the counts do not add up (ImpossibleFigure: exit non-zero); here, what it reports."""
    done = evq.run("bench", "--quick", "--mode", "retention", "-o", "json", timeout=300, EVQ_DATABASE_URL=pg_server)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    contract.check(("bench",), out)
    figures = {r["name"]: r for r in out["data"]["results"]}
    assert {r["mode"] for r in out["data"]["results"]} == {"retention"}
    assert figures["prune: partitions dropped"]["median"] >= 10
    assert figures["prune: evidence rows dropped with partitions"]["median"] > 0
    drains = [r for r in out["data"]["results"] if r["name"].startswith("evq drain, 1 process")]
    assert len(drains) == 2 and all(r["median"] > 0 for r in drains)
    targets = {t["target"]: t for t in out["data"]["targets"]}
    assert targets["retention: one partition dropped / its rows pruned by batches <= 0.1"]["met"] in (True, False)
