"""What one `evq bench` run measures (sizes, runs, modes) and one measured figure."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from bench.modes import DEFAULT_MODES, MODES
from evq.worker.errors import ConfigError, EvqError


@dataclass(frozen=True, slots=True)
class BenchConfig:
    server_url: str
    steps: int = 20_000
    runs: int = 3
    modes: tuple[str, ...] = DEFAULT_MODES
    drain_processes: tuple[int, ...] = (1, 2)
    drain_concurrency: int = 200
    batch_size: int = 100
    latency_delay: float = 0.05
    latency_concurrency: tuple[int, ...] = (50, 200, 500)
    latency_waves: int = 20  # each run sends concurrency x waves steps
    enqueue_single: int = 2_000
    pickup_samples: int = 200
    poll_interval: float = 0.25
    scale_rows: int = 1_000_000
    peer: str = "auto"  # auto: measure pgqueuer when it is installed; on: require it; off
    page_steps: int = 1_000_000  # the ops-pages mode's database
    page_repeat: int = 20  # reads of each page (after the warm-ups)
    retention_rows: int = 10_000_000  # the retention mode's evidence rows (about 3 a step)

    @classmethod
    def quick(cls, server_url: str, **overrides: Any) -> BenchConfig:
        """CI-sized: every mode, seconds each, one run."""
        base = cls(
            server_url,
            steps=2_000,
            runs=1,
            latency_waves=4,
            enqueue_single=200,
            pickup_samples=20,
            scale_rows=20_000,
            page_steps=3_000,
            page_repeat=2,
            retention_rows=30_000,
        )
        return replace(base, **overrides)

    def validate(self) -> BenchConfig:
        problems = []
        if self.steps < 100:
            problems.append("--steps must be at least 100")
        if self.runs < 1:
            problems.append("--runs must be at least 1")
        if self.scale_rows < 1000:
            problems.append("--scale-rows must be at least 1000")
        if self.page_steps < 1000:
            problems.append("--steps must be at least 1000 for the ops-pages mode")
        if self.retention_rows < 3000:
            problems.append("--scale-rows must be at least 3000 for the retention mode")
        if self.page_repeat < 1:
            problems.append("--repeat must be at least 1")
        if not self.drain_processes or not all(1 <= p <= 64 for p in self.drain_processes):
            problems.append("--processes must be between 1 and 64")
        if unknown := set(self.modes) - set(MODES):
            problems.append(f"unknown mode(s) {', '.join(sorted(unknown))}; known: {', '.join(MODES)}")
        if self.peer not in ("auto", "on", "off"):
            problems.append("peer must be auto, on or off")
        if problems:
            raise ConfigError("; ".join(problems))
        return self


class ImpossibleFigure(EvqError):
    """A figure that cannot be right (a negative, NaN or infinite latency, duration, rate or RSS;
    a rate of zero): the run stops and names it rather than report it, or score it as met."""


def check_value(figure: str, what: str, value: float, *, positive: bool = False) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ImpossibleFigure(f"{figure}: {what} {value!r} cannot be right", context={"figure": figure})


@dataclass
class Figure:
    """One measured quantity over repeated runs; refused (ImpossibleFigure) when any run's value,
    its peak RSS or a ratio cannot be right."""

    mode: str
    name: str
    unit: str
    values: list[float]
    rss_mb: float | None = None
    ratios: dict[str, float | None] = field(default_factory=dict)
    note: str | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        name = f"{self.mode}: {self.name}"
        if not self.values:
            raise ImpossibleFigure(f"{name}: no value measured", context={"figure": name})
        rate = self.unit.endswith("/s")  # a throughput: a run that finished did some work
        for value in self.values:
            check_value(name, self.unit, value, positive=rate)
        if self.rss_mb is not None:
            check_value(name, "peak RSS (MB)", self.rss_mb, positive=True)
        for key, ratio in self.ratios.items():
            if ratio is not None:
                check_value(name, f"ratio {key}", ratio)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def to_dict(self) -> dict[str, Any]:
        self.check()  # again: ratios are added after the figure is made
        return {
            "mode": self.mode,
            "name": self.name,
            "unit": self.unit,
            "median": round(self.median, 3),
            "min": round(min(self.values), 3),
            "max": round(max(self.values), 3),
            "runs": [round(v, 3) for v in self.values],
            "rss_mb": None if self.rss_mb is None else round(self.rss_mb, 1),
            "ratios": {k: None if v is None else round(v, 3) for k, v in self.ratios.items()},
            "note": self.note,
        }
