"""The overview's pictures as inline SVG (issue 18): pure functions from the store's chart
series (worker/ports/charts.py) to markup, no script and no external asset.

Each figure is a ``<figure>``: the SVG (``role="img"``, a ``<title>`` and an aria-label that
say the figure's numbers in words), a caption saying exactly what is counted, and a
``<details>`` table with the same numbers, for a screen reader, a copy and paste, or a
colour-blind reader. The legend never relies on colour alone: every series has its own
fill pattern and its name beside it. Every text that reaches the markup passes
:func:`markupsafe.escape`; the only markup not escaped is what this module writes.
Times on the axes are in the operator's time zone (the page's ``tz``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo
from typing import Any

from markupsafe import Markup, escape

from evq.worker.window import SEND_OUTCOMES, UNKNOWN_AGE_LABELS, bucket_start

WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 10, 26
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

OUTCOME_LABELS = {
    "accepted": "accepted",
    "rejected": "rejected",
    "retryable": "retryable",
    "unknown": "unknown",
    "no_answer": "no answer",
}
# One fill pattern per series (its class in ops.css gives it a colour too).
PATTERNS = ("solid", "hatch", "dots", "cross", "stripes")


def _e(value: Any) -> str:
    return str(escape(value))


def window_words(hours: int) -> str:
    return "the last hour" if hours == 1 else f"the last {hours} hours"


def _short_window(hours: int) -> str:
    return f"the last {hours} h"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def duration(seconds: float) -> str:
    """A short duration for a tick or a summary: 45s, 3m 20s, 2h 5m, 1d 3h."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f" {s % 60}s" if s % 60 else "")
    if s < 86400:
        return f"{s // 3600}h" + (f" {s % 3600 // 60}m" if s % 3600 // 60 else "")
    return f"{s // 86400}d" + (f" {s % 86400 // 3600}h" if s % 86400 // 3600 else "")


def _nice_max(value: float) -> float:
    """The y axis's top: the least of 1, 2, 2.5, 5 times a power of ten at or above ``value``."""
    if value <= 0:
        return 1.0
    power = 1.0
    while power * 10 <= value:
        power *= 10
    while power > value:
        power /= 10
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _number(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value:.3g}"


SHAPES = {
    "solid": '<rect width="6" height="6" class="fill"/>',
    "hatch": '<rect width="6" height="6" class="ground"/><path d="M0,6 L6,0" class="ink"/>',
    "dots": '<rect width="6" height="6" class="ground"/><circle cx="3" cy="3" r="1.4" class="fill"/>',
    "cross": '<rect width="6" height="6" class="ground"/><path d="M0,0 L6,6 M0,6 L6,0" class="ink"/>',
    "stripes": '<rect width="6" height="6" class="ground"/><path d="M0,3 L6,3" class="ink"/>',
}


def _pattern(prefix: str, name: str) -> str:
    # Its colour comes from the pattern's class (ops.css): a pattern's content does not
    # inherit the style of the shape it fills.
    return (
        f'<pattern id="{prefix}-{name}" class="pattern-{name}" width="6" height="6" patternUnits="userSpaceOnUse">'
        f"{SHAPES[name]}</pattern>"
    )


def _defs(prefix: str) -> str:
    """The fill patterns, with ids under this figure's prefix (a page holds several figures)."""
    return "<defs>" + "".join(_pattern(prefix, name) for name in PATTERNS) + "</defs>"


def _svg(prefix: str, summary: str, body: str, *, height: int = HEIGHT) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="{_e(prefix)}-svg" role="img" '
        f'viewBox="0 0 {WIDTH} {height}" width="100%" aria-label="{_e(summary)}">'
        f"<title>{_e(summary)}</title>{_defs(_e(prefix))}{body}</svg>"
    )


def _y_axis(top: float, fmt: Any = _number) -> str:
    parts = [f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + PLOT_H}"/>']
    for frac in (0, 0.5, 1):
        y = TOP + PLOT_H - frac * PLOT_H
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + PLOT_W}" y2="{y:.1f}"/>')
        parts.append(
            f'<text class="tick" x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{_e(fmt(top * frac))}</text>'
        )
    return "".join(parts)


def _x_axis(since: datetime, until: datetime, tz: tzinfo) -> str:
    """Ticks at round local times: every 10 minutes for an hour, every hour for 6, every 4 for 24."""
    span = (until - since).total_seconds()
    step = 600 if span <= 3600 else 3600 if span <= 6 * 3600 else 4 * 3600
    parts = [f'<line class="axis" x1="{LEFT}" y1="{TOP + PLOT_H}" x2="{LEFT + PLOT_W}" y2="{TOP + PLOT_H}"/>']
    local = since.astimezone(tz)
    # The first round local time at or after the window's start (round in the operator's zone).
    offset = local.utcoffset() or timedelta(0)
    epoch = since.timestamp() + offset.total_seconds()
    tick = since + timedelta(seconds=(-epoch) % step)
    while tick <= until:
        x = LEFT + (tick - since).total_seconds() / span * PLOT_W
        label = tick.astimezone(tz).strftime("%H:%M")
        parts.append(f'<line class="axis" x1="{x:.1f}" y1="{TOP + PLOT_H}" x2="{x:.1f}" y2="{TOP + PLOT_H + 4}"/>')
        parts.append(f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{_e(label)}</text>')
        tick += timedelta(seconds=step)
    return "".join(parts)


def _legend(prefix: str, names: Sequence[str]) -> str:
    """Each series' pattern beside its name: the name says it, the pattern and colour repeat it."""
    items = []
    for i, name in enumerate(names):
        pattern = PATTERNS[i % len(PATTERNS)]
        own = f"{_e(prefix)}-legend-{i}"
        items.append(
            f'<li><svg xmlns="http://www.w3.org/2000/svg" class="swatch" viewBox="0 0 12 12" width="12" height="12" aria-hidden="true">'
            f'<defs>{_pattern(own, pattern)}</defs><rect width="12" height="12" fill="url(#{own}-{pattern})"/></svg> '
            f"{_e(name)}</li>"
        )
    return f'<ul class="legend">{"".join(items)}</ul>'


def _table(prefix: str, caption: str, head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    th = "".join(f'<th scope="col">{_e(h)}</th>' for h in head)
    # A day of minutes is thousands of cells: each escaped by markupsafe's escape itself (a str),
    # joined once per row.
    body = "".join(f"<tr><td>{'</td><td>'.join(map(escape, row))}</td></tr>" for row in rows)
    if not rows:
        body = f'<tr><td colspan="{len(head)}">none</td></tr>'
    return (
        f'<details class="chart-table"><summary>{_e(caption)} as a table</summary>'
        f'<table id="{_e(prefix)}-table"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table></details>'
    )


def _figure(prefix: str, heading: str, svg: str, legend: str, caption: str, table: str) -> Markup:
    return Markup(
        f'<figure class="chart" id="{_e(prefix)}"><h3>{_e(heading)}</h3>{svg}{legend}'
        f"<figcaption>{_e(caption)}</figcaption>{table}</figure>"
    )


# -- sends per bucket by outcome -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sends:
    starts: list[datetime]  # every bucket of the window, oldest first
    counts: dict[str, list[int]]  # outcome -> a count per bucket
    totals: dict[str, int]


def sends_series(rows: Sequence[Mapping[str, Any]], *, since: datetime, until: datetime, bucket: int) -> Sends:
    """The store's (at, outcome, n) rows as a count per bucket and outcome; a bucket with no
    row is a real zero (nothing was sent), so every bucket of the window is there."""
    first = bucket_start(since, bucket)
    n = int((until - first).total_seconds() // bucket) + 1
    starts = [first + timedelta(seconds=i * bucket) for i in range(n)]
    counts = {o: [0] * n for o in SEND_OUTCOMES}
    for row in rows:
        i = int((row["at"] - first).total_seconds() // bucket)
        if 0 <= i < n and row["outcome"] in counts:
            counts[row["outcome"]][i] += int(row["n"])
    return Sends(starts, counts, {o: sum(c) for o, c in counts.items()})


def sends_summary(sends: Sends, hours: int) -> str:
    total = sum(sends.totals.values())
    parts = [f"{n} {OUTCOME_LABELS[o]}" for o, n in sends.totals.items() if n]
    head = f"{_plural(total, 'send')} in {_short_window(hours)}"
    return f"{head}: {', '.join(parts)}" if parts else head


def sends_chart(sends: Sends, *, hours: int, bucket: int, since: datetime, until: datetime, tz: tzinfo) -> Markup:
    prefix = "chart-sends"
    summary = sends_summary(sends, hours)
    n = len(sends.starts)
    stacks = [sum(sends.counts[o][i] for o in SEND_OUTCOMES) for i in range(n)]
    top = _nice_max(max(stacks, default=0))
    span = (until - since).total_seconds()
    width = bucket / span * PLOT_W
    bars = []
    for i, start in enumerate(sends.starts):
        x = LEFT + max(0.0, (start - since).total_seconds()) / span * PLOT_W
        end = min(LEFT + PLOT_W, LEFT + ((start - since).total_seconds() + bucket) / span * PLOT_W)
        w = max(0.5, min(width, end - x) - 1)
        y = TOP + PLOT_H
        for k, outcome in enumerate(SEND_OUTCOMES):
            count = sends.counts[outcome][i]
            if not count:
                continue
            h = count / top * PLOT_H
            y -= h
            label = f"{start.astimezone(tz):%H:%M}: {count} {OUTCOME_LABELS[outcome]}"
            bars.append(
                f'<rect class="series-{k}" x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" '
                f'fill="url(#{prefix}-{PATTERNS[k]})"><title>{_e(label)}</title></rect>'
            )
    body = _y_axis(top) + _x_axis(since, until, tz) + "".join(bars)
    caption = (
        f"Sends per {duration(bucket)} in {window_words(hours)}, by outcome: each provider answer recorded "
        "(provider_response evidence: accepted, rejected, retryable, unknown), and each send whose lease "
        "ran out with no answer at all, made unknown by the rescuer (lease_expired evidence, \u201cno answer\u201d). "
        "Times in the operator's time zone."
    )
    rows = [
        [f"{s.astimezone(tz):%Y-%m-%d %H:%M}", *(sends.counts[o][i] for o in SEND_OUTCOMES)]
        for i, s in enumerate(sends.starts)
        if stacks[i]
    ]
    rows.append(["total", *(sends.totals[o] for o in SEND_OUTCOMES)])
    table = _table(prefix, "Sends", ["bucket start", *(OUTCOME_LABELS[o] for o in SEND_OUTCOMES)], rows)
    legend = _legend(prefix, [OUTCOME_LABELS[o] for o in SEND_OUTCOMES])
    return _figure(prefix, "Sends by outcome", _svg(prefix, summary, body), legend, caption, table)


# -- unknown rows by age --------------------------------------------------------------


def unknown_summary(counts: Sequence[int]) -> str:
    total = sum(counts)
    parts = [f"{n} aged {label}" for label, n in zip(UNKNOWN_AGE_LABELS, counts, strict=True) if n]
    head = f"{_plural(total, 'unknown row')} now"
    return f"{head}: {', '.join(parts)}" if parts else head


def unknown_chart(counts: Sequence[int]) -> Markup:
    prefix = "chart-unknown-ages"
    summary = unknown_summary(counts)
    top = _nice_max(max(counts, default=0))
    slot = PLOT_W / len(UNKNOWN_AGE_LABELS)
    parts = [_y_axis(top)]
    parts.append(f'<line class="axis" x1="{LEFT}" y1="{TOP + PLOT_H}" x2="{LEFT + PLOT_W}" y2="{TOP + PLOT_H}"/>')
    for i, (label, n) in enumerate(zip(UNKNOWN_AGE_LABELS, counts, strict=True)):
        x = LEFT + i * slot
        h = n / top * PLOT_H
        parts.append(
            f'<rect class="series-3" x="{x + 4:.1f}" y="{TOP + PLOT_H - h:.1f}" width="{slot - 8:.1f}" '
            f'height="{h:.1f}" fill="url(#{prefix}-dots)"><title>{_e(f"{n} aged {label}")}</title></rect>'
        )
        parts.append(
            f'<text class="tick" x="{x + slot / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle">{_e(label)}</text>'
        )
        if n:
            parts.append(
                f'<text class="value" x="{x + slot / 2:.1f}" y="{TOP + PLOT_H - h - 3:.1f}" '
                f'text-anchor="middle">{_e(n)}</text>'
            )
    caption = (
        "Rows unknown now (the answer may or may not have reached the provider), by how long each has been "
        "unknown (its unknown_since). Each waits for the reconciler or an operator."
    )
    table = _table(
        prefix,
        "Unknown rows by age",
        ["age", "rows"],
        [[label, n] for label, n in zip(UNKNOWN_AGE_LABELS, counts, strict=True)],
    )
    return _figure(prefix, "Unknown rows by age", _svg(prefix, summary, "".join(parts)), "", caption, table)


# -- a queue figure over time, with gaps -----------------------------------------------


def minute_label(at: datetime, tz: tzinfo) -> str:
    """``at`` as YYYY-MM-DD HH:MM in ``tz``: strftime's "%Y-%m-%d %H:%M" for every year of four
    digits, by isoformat (a day of minutes is 1,440 of them per chart, and strftime is slower)."""
    return at.astimezone(tz).isoformat(" ")[:16]


def line_summary(what: str, samples: Sequence[Mapping[str, Any]], key: str, hours: int, fmt: Any) -> str:
    values = [float(s[key]) for s in samples if s[key] is not None]
    if not samples:
        return f"{what}: no sample in {_short_window(hours)}"
    if not values:
        return f"{what}: none in {_short_window(hours)} ({_plural(len(samples), 'minute')} sampled)"
    return (
        f"{what} over {_short_window(hours)}: {_plural(len(samples), 'minute')} sampled, "
        f"at most {fmt(max(values))}, latest {fmt(values[-1])}"
    )


def line_chart(
    prefix: str,
    heading: str,
    samples: Sequence[Mapping[str, Any]],
    key: str,
    *,
    hours: int,
    since: datetime,
    until: datetime,
    tz: tzinfo,
    seconds: bool = False,
    caption: str,
) -> Markup:
    """One figure of queue_samples over the window: a line through consecutive minutes, broken
    where a minute has no sample (no process was sampling), never drawn down to zero there."""
    fmt = duration if seconds else _number
    summary = line_summary(heading, samples, key, hours, fmt)
    values = [float(s[key]) if s[key] is not None else None for s in samples]
    top = _nice_max(max((v for v in values if v is not None), default=0))
    span = (until - since).total_seconds()
    # A run is a line through consecutive minutes; a minute without a sample starts another.
    runs: list[list[str]] = []
    previous: datetime | None = None
    minute = timedelta(seconds=60)
    x_scale, y_scale = PLOT_W / span, PLOT_H / top
    for s, v in zip(samples, values, strict=True):
        if v is None:
            previous = None
            continue
        at = s["at"]
        if previous is None or at - previous > minute:
            runs.append([])
        runs[-1].append(f"{LEFT + (at - since).total_seconds() * x_scale:.1f},{TOP + PLOT_H - v * y_scale:.1f}")
        previous = at
    parts = [_y_axis(top, fmt), _x_axis(since, until, tz)]
    for run in runs:
        if len(run) == 1:
            x, y = run[0].split(",")
            parts.append(f'<circle class="line-point" cx="{x}" cy="{y}" r="2"/>')
        else:
            parts.append(f'<path class="line" d="M{" L".join(run)}"/>')
    rows = [[minute_label(s["at"], tz), "-" if v is None else fmt(v)] for s, v in zip(samples, values, strict=True)]
    table = _table(prefix, heading, ["minute", heading.lower()], rows)
    return _figure(prefix, heading, _svg(prefix, summary, "".join(parts)), "", caption, table)


# -- per provider ------------------------------------------------------------------------


def answers(row: Mapping[str, Any]) -> int:
    return sum(int(row[o]) for o in SEND_OUTCOMES)


def provider_summary(row: Mapping[str, Any], hours: int) -> str:
    parts = [f"{int(row[o])} {OUTCOME_LABELS[o]}" for o in SEND_OUTCOMES if row[o]]
    text = f"{row['provider']}: {_plural(int(row['attempts']), 'attempt')} started in {_short_window(hours)}"
    text += f", {_plural(answers(row), 'answer')}" + (f" ({', '.join(parts)})" if parts else "")
    if row.get("p50_ms") is not None:
        text += f"; latency over the last hour median {row['p50_ms']:.0f} ms, p95 {row['p95_ms']:.0f} ms"
    return text


def provider_chart(row: Mapping[str, Any], *, hours: int) -> Markup:
    """A small bar per provider: its answers in the window split by outcome, left to right."""
    prefix = f"chart-provider-{row['provider']}"
    summary = provider_summary(row, hours)
    total = answers(row)
    height, inner = 22, WIDTH - 2
    parts = [f'<rect class="track" x="1" y="1" width="{inner}" height="{height - 2}"/>']
    x = 1.0
    for k, outcome in enumerate(SEND_OUTCOMES):
        n = int(row[outcome])
        if not n:
            continue
        w = n / total * inner
        parts.append(
            f'<rect class="series-{k}" x="{x:.1f}" y="1" width="{w:.1f}" height="{height - 2}" '
            f'fill="url(#{_e(prefix)}-{PATTERNS[k]})"><title>{_e(f"{n} {OUTCOME_LABELS[outcome]}")}</title></rect>'
        )
        x += w
    return Markup(_svg(prefix, summary, "".join(parts), height=height))


def providers_table(rows: Sequence[Mapping[str, Any]], hours: int) -> Markup:
    head = [
        "provider",
        "attempts",
        *(OUTCOME_LABELS[o] for o in SEND_OUTCOMES),
        "median ms (last hour)",
        "p95 ms (last hour)",
    ]
    body = [
        [
            r["provider"],
            r["attempts"],
            *(r[o] for o in SEND_OUTCOMES),
            "-" if r.get("p50_ms") is None else f"{r['p50_ms']:.0f}",
            "-" if r.get("p95_ms") is None else f"{r['p95_ms']:.0f}",
        ]
        for r in rows
    ]
    return Markup(_table("chart-providers", f"Providers in {window_words(hours)}", head, body))


def legend(names: Sequence[str] = tuple(OUTCOME_LABELS[o] for o in SEND_OUTCOMES)) -> Markup:
    return Markup(_legend("legend-outcomes", names))
