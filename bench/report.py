"""The report: each figure's ratios to the ceiling and the peer, the targets (the issue's, checked
on this machine), the human table, and the revision measured."""

from __future__ import annotations

import math
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.config import Figure, ImpossibleFigure


def find(figures: Sequence[Figure], mode: str, prefix: str) -> Figure | None:
    return next((f for f in figures if f.mode == mode and f.name.startswith(prefix)), None)


def add_ratios(figures: Sequence[Figure]) -> None:
    """Every drain to the raw SQL ceiling and to pgqueuer's drains, every enqueue to pgqueuer's
    (unless the enqueue mode already paired them run by run), pgqueuer's drains to the ceiling,
    each latency-bound drain to its bound: min(ideal, the 1-process null-adapter drain)."""
    ceiling = find(figures, "ceiling", "raw SQL ceiling")
    default = find(figures, "peer", "pgqueuer drain, default")
    best = find(figures, "peer", "pgqueuer drain, best")
    p_single = find(figures, "peer", "pgqueuer single enqueue")
    p_single_p50 = find(figures, "peer", "pgqueuer single enqueue p50")
    p_batch = find(figures, "peer", "pgqueuer batch")
    d1 = find(figures, "drain", "evq drain, 1 process")
    for f in figures:
        if f.mode in ("drain", "scale") and f.unit == "steps/s":
            for key, ref in (("ceiling", ceiling), ("pgqueuer_default", default), ("pgqueuer_best", best)):
                f.ratios[key] = f.median / ref.median if ref else None
        elif f.mode == "latency" and "ideal" in f.ratios:
            ideal = f.median / f.ratios["ideal"] if f.ratios["ideal"] else None
            bound = None if ideal is None or d1 is None else min(ideal, d1.median)
            f.ratios["bound"] = f.median / bound if bound else None
        elif f.name.startswith("evq single enqueue p50"):
            f.ratios.setdefault("pgqueuer_single_p50", f.median / p_single_p50.median if p_single_p50 else None)
        elif f.name.startswith("evq single enqueue"):
            f.ratios.setdefault("pgqueuer_single", f.median / p_single.median if p_single else None)
        elif f.name.startswith("evq batch enqueue"):
            f.ratios.setdefault("pgqueuer_batch", f.median / p_batch.median if p_batch else None)
        elif f.mode == "peer" and f.unit in ("jobs/s", "workflows/s") and "drain" in f.name and ceiling:
            f.ratios["ceiling"] = f.median / ceiling.median


def targets(figures: Sequence[Figure]) -> list[dict[str, Any]]:
    """Issue 19's table (each figure a ratio from this run, peers measured alternately where the peer
    mode ran), then the earlier issues' targets that table does not restate."""

    def find(prefix: str, mode: str | None = None) -> Figure | None:
        return next((f for f in figures if f.name.startswith(prefix) and mode in (None, f.mode)), None)

    out: list[dict[str, Any]] = []

    def check(target: str, value: float | None, threshold: float, op: str = ">=") -> None:
        if value is not None and not math.isfinite(value):
            raise ImpossibleFigure(f"target {target!r}: its value {value} cannot be right")
        met = (
            None if value is None else {">=": value >= threshold, "<=": value <= threshold, "<": value < threshold}[op]
        )
        out.append(
            {"target": target, "value": None if value is None else round(value, 3), "threshold": threshold, "met": met}
        )

    def drain_ratio(processes: str, key: str) -> float | None:
        """The drain's ratio to a peer: paired round by round when the peer mode ran, else the
        drain mode's median over the peer mode's."""
        paired = find(f"evq drain, {processes}, alternated with the peers", "peer")
        if paired is not None and paired.ratios.get(key) is not None:
            return paired.ratios[key]
        drain = find(f"evq drain, {processes}", "drain")
        return drain.ratios.get(key) if drain else None

    # Issue 31's table (it replaced issue 19's ratios to the peers).
    check("drain 2 processes / pgqueuer best >= 0.7", drain_ratio("2 processes", "pgqueuer_best"), 0.7)
    check("drain 1 process / pgqueuer default >= 1.5", drain_ratio("1 process", "pgqueuer_default"), 1.5)
    single = find("evq single enqueue (Python API, own transaction)")
    single_p50 = find("evq single enqueue p50")
    check("single enqueue / pgqueuer single >= 1", single and single.ratios.get("pgqueuer_single"), 1.0)
    check(
        "single enqueue p50 / pgqueuer single p50 <= 1.2",
        single_p50 and single_p50.ratios.get("pgqueuer_single_p50"),
        1.2,
        "<=",
    )
    batch = find("evq batch enqueue")
    check("batch enqueue / pgqueuer batch >= 0.8", batch and batch.ratios.get("pgqueuer_batch"), 0.8)
    for concurrency, share in ((200, 0.9), (500, 0.8)):
        lat = find(f"evq latency-bound, concurrency {concurrency}", "latency")
        check(
            f"latency-bound, concurrency {concurrency}: share of min(ideal, 1-process drain) >= {share:g}",
            lat and lat.ratios.get("bound"),
            share,
        )
    lat500 = find("evq latency-bound, concurrency 500", "latency")
    check("worker RSS at concurrency 500 <= 100 MB", lat500 and lat500.rss_mb, 100.0, "<=")
    scale = next((f for f in figures if f.mode == "scale" and f.unit == "steps/s"), None)
    rows = scale.name.split(", ")[-1].removesuffix(" present") if scale else "terminal rows"
    check(f"drain with {rows} present / empty-table drain >= 0.95", scale and scale.ratios.get("empty_table"), 0.95)
    d2 = find("evq drain, 2 processes", "drain")
    check("drain 2 processes / raw ceiling >= 0.75", d2 and d2.ratios.get("ceiling"), 0.75)
    # Not in issue 31's table; from the issues before it.
    for what, limit in (("p50", 5.0), ("p99", 50.0)):
        f = find(f"evq pickup {what}, LISTEN")
        check(f"pickup {what} with LISTEN/NOTIFY < {limit:g} ms", f and f.median, limit, "<")
    poll = find("evq pickup p99, polling")
    if poll is not None:
        interval_ms = float(poll.name.rsplit("every ", 1)[1].rstrip("s")) * 1000
        check("pickup p99 polling only < poll interval (ms)", poll.median, interval_ms, "<")
    # Retention (issue 19): whole partitions instead of rows, and no slower with many of them.
    for what in ("evq drain, 1 process", "evq single enqueue"):
        many = next(
            (f for f in figures if f.mode == "retention" and "few_partitions" in f.ratios and f.name.startswith(what)),
            None,
        )
        check(f"retention: {what} with many partitions / few >= 0.9", many and many.ratios["few_partitions"], 0.9)
    one = find("row-by-row prune of one partition's worth", "retention")
    check(
        "retention: one partition dropped / its rows pruned by batches <= 0.1",
        one and one.ratios.get("partition_drop"),
        0.1,
        "<=",
    )
    collector = find("metrics collector")
    check("collector query < 50 ms", collector and collector.median, 50.0, "<")
    # Issue 31: start-up, and the database's cost per step.
    spawn = find("evq spawn to first claim")
    check("spawn to first claim / pgqueuer's <= 1.3", spawn and spawn.ratios.get("pgqueuer_spawn"), 1.3, "<=")
    wal = find("evq drain, 2 processes: WAL per step", "drain")
    check("WAL per step, 2-process drain <= 2048 bytes", wal and wal.median, 2048.0, "<=")
    return out


def page_targets(pages: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One target per page the ops-pages mode read: its p95 server time under the target."""
    return [
        {
            "target": f"ops page {r['page']}: p95 < {pages['target_ms']:g} ms",
            "value": r["p95"],
            "threshold": pages["target_ms"],
            "met": r["met"],
        }
        for r in (pages or {}).get("rows", [])
    ]


def pages_table(pages: dict[str, Any]) -> list[str]:
    """The ops-pages mode's table: each page's server time (Server-Timing) over its reads."""
    rows = [("page", "p50 ms", "p95 ms", "max ms", "target", "")]
    for r in pages["rows"]:
        mark = "met" if r["met"] else "NOT met"
        rows.append(
            (r["page"], f"{r['p50']:.1f}", f"{r['p95']:.1f}", f"{r['max']:.1f}", f"{r['target_ms']:g} ms", mark)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        f"ops pages: {pages['steps']:,} steps filled in {pages['fill_seconds']:.0f}s, database "
        f"{pages['database_bytes'] / 2**20:,.0f} MB; {pages['repeat']} reads of each page after "
        f"{pages['warmups']} warm-ups, server time from Server-Timing",
    ]
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if k in (0, 5) else cell.rjust(w)
                for k, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def human(report: dict[str, Any]) -> str:
    lines = [
        f"evq bench  revision {report['revision']}  {report['seconds']}s  "
        f"load {report['machine']['load_before']} -> {report['machine']['load_after']}  "
        f"PostgreSQL {report['machine']['postgres']}  peer: {report['machine']['peer'] or 'none'}"
        + (f", dbos {report['machine']['dbos']}" if report["machine"].get("dbos") else ""),
        "",
    ]
    rows = [("figure", "median", "min-max", "unit", "ratios", "peak RSS")]
    for r in report["results"]:
        ratios = "  ".join(f"{k}={v:.2f}" for k, v in r["ratios"].items() if v is not None)
        rss = "-" if r["rss_mb"] is None else f"{r['rss_mb']:.0f} MB"
        rows.append((r["name"], _num(r["median"]), f"{_num(r['min'])}-{_num(r['max'])}", r["unit"], ratios, rss))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(w) if k in (0, 3, 4) else cell.rjust(w)
                for k, (cell, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if report.get("pages"):
        lines += ["", *pages_table(report["pages"])]
    lines += ["", "targets:"]
    for t in report["targets"]:
        mark = {True: "met    ", False: "NOT met", None: "n/a    "}[t["met"]]
        value = "-" if t["value"] is None else _num(t["value"])
        lines.append(f"  {mark}  {t['target']}  (value {value})")
    for note in report["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _num(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def git_revision() -> str:
    """The checkout's commit (``-dirty`` with uncommitted changes); an installed evq has no
    checkout, and git must not report whichever repository happens to enclose site-packages."""
    import evq

    root = Path(evq.__file__).resolve().parent.parent
    if not (root / "worker" / "__init__.py").is_file():
        return f"evq {evq.__version__} (installed)"
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("-dirty" if dirty else "")
