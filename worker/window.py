"""The overview's chart windows (issue 18): how far back each picture looks, and how wide its
buckets are, so the page, both stores and the tests agree on one table."""

from __future__ import annotations

from datetime import datetime, timedelta

from evq.worker.errors import InvalidRequest

# hours -> bucket seconds: 60 one-minute bars for 1 h, 72 five-minute bars for 6 h, 96 quarter hours for 24 h.
WINDOWS: dict[int, int] = {1: 60, 6: 300, 24: 900}
DEFAULT_HOURS = 6

# Lower bounds (seconds) of the unknown-age buckets after the first: <5m, 5-30m, 30m-2h,
# 2-12h, 12h-1d, 1-3d, >3d (width_bucket's thresholds).
UNKNOWN_AGES: tuple[float, ...] = (300, 1800, 7200, 43200, 86400, 259200)
UNKNOWN_AGE_LABELS: tuple[str, ...] = ("<5m", "5-30m", "30m-2h", "2-12h", "12h-1d", "1-3d", ">3d")

# What the sends chart counts: the four answers, and the steps lost without one.
SEND_OUTCOMES: tuple[str, ...] = ("accepted", "rejected", "retryable", "unknown", "no_answer")

# How long queue_samples keeps a minute (the sampler deletes older ones as it writes).
KEEP_SAMPLES = 7 * 86400.0


def bucket_seconds(hours: int) -> int:
    """The bucket width of a window; any other ``hours`` is refused, not guessed."""
    if hours not in WINDOWS:
        raise InvalidRequest([{"field": "hours", "message": f"expected one of {sorted(WINDOWS)}"}])
    return WINDOWS[hours]


def bounds(hours: int, now: datetime) -> tuple[datetime, datetime]:
    """(since, until) of the window ending at ``now``."""
    bucket_seconds(hours)
    return now - timedelta(hours=hours), now


def bucket_start(at: datetime, seconds: int) -> datetime:
    """The start of the bucket ``at`` falls in (buckets aligned on the Unix epoch, as the SQL's)."""
    epoch = at.timestamp()
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=at.tzinfo)
