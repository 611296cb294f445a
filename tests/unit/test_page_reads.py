"""The overview's reads run at once (ops/web/page/common.py's ``concurrently``): the answers in
the reads' order, and a failure raised only once every read has ended, the first in order."""

from __future__ import annotations

import asyncio

import pytest

from evq.ops.app.contract import Timer
from evq.ops.web.page.common import concurrently
from evq.ops.web.protocol import server_timing
from evq.worker.errors import InvalidRequest


def test_the_reads_run_together_and_answer_in_their_order():
    running, most = 0, 0

    async def read(value: int, seconds: float) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(seconds)
        running -= 1
        return value

    answers = asyncio.run(concurrently(read(1, 0.05), read(2, 0.01), read(3, 0.03)))
    assert answers == [1, 2, 3] and most == 3


def test_a_failure_is_raised_after_every_read_ended_the_first_in_order():
    ended: list[str] = []

    async def fails(name: str, seconds: float) -> None:
        await asyncio.sleep(seconds)
        ended.append(name)
        raise InvalidRequest([{"field": name, "message": "no"}])

    async def slow() -> str:
        await asyncio.sleep(0.05)
        ended.append("slow")
        return "done"

    with pytest.raises(InvalidRequest) as caught:
        asyncio.run(concurrently(slow(), fails("second", 0.02), fails("third", 0.01)))
    assert caught.value.errors[0]["field"] == "second"
    assert sorted(ended) == ["second", "slow", "third"]


def test_server_timing_names_each_timed_part_after_the_whole():
    timer = Timer()
    assert server_timing(timer).startswith("app;dur=") and "," not in server_timing(timer)
    with timer.part("read"):
        pass
    with timer.part("draw"):
        pass
    with timer.part("read"):
        pass
    entries = server_timing(timer).split(", ")
    assert [e.split(";")[0] for e in entries] == ["app", "read", "draw"]
    assert all(float(e.split("dur=")[1]) >= 0 for e in entries)
