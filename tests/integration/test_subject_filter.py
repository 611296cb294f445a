"""The subject filter (issue 34; docs/design.md, "Search by subject"): a case-insensitive
substring of the request's subject, on top of the other filters, newest first, read from the
newest SUBJECT_SCAN_CAP steps the other filters leave. Real PostgreSQL, the store's own reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from evq.adapters.postgres.store import steps as store_steps
from evq.worker.ports import StepFilter
from evq.worker.states import Status
from tests.support import unknown_steps, valid


async def _enqueue(store, subjects: list[str], **request) -> list[int]:
    made = []
    for i, subject in enumerate(subjects):
        made.append(
            (
                await store.enqueue(
                    valid(subject=subject, **request), now=datetime.now(UTC) - timedelta(minutes=60 - i)
                )
            ).id
        )
    return made


async def test_a_subject_is_found_in_any_case_as_a_substring_and_only_where_the_other_filters_hold(store):
    # The unknown one first: the helper's claim takes the oldest claimable step.
    [lost] = [s.id for s in await unknown_steps(store, 1, run_id="r-a", subject="Order 17: we lost the reply")]
    ours = await _enqueue(
        store, ["Your ORDER 17 is late", "order 170 shipped", "Invoice 17", "50% off_today"], run_id="r-a"
    )
    theirs = await _enqueue(store, ["your order 17 is late"], run_id="r-b")

    found = await store.list_by_subject(StepFilter(subject="order 17", run_id="r-a"))
    # Newest first, every state; the other run's match is not there.
    assert [r.id for r in found.rows] == [ours[1], ours[0], lost]
    assert found.scanned == 5 and not found.cut  # every step of run r-a read, none cut
    assert found.by_status == {**{str(s): 0 for s in Status}, "pending": 2, "unknown": 1}
    assert theirs[0] not in [r.id for r in found.rows]
    # The states filter the scan: only the unknown hit.
    only = await store.list_by_subject(StepFilter(subject="ORDER 17", run_id="r-a", statuses=(Status.UNKNOWN,)))
    assert [r.id for r in only.rows] == [lost] and only.scanned == 1
    # % and _ are characters, not patterns: "0% OFF_" finds the subject holding it; "0_" (as a
    # LIKE pattern it would match "0%") finds none.
    assert [r.id for r in (await store.list_by_subject(StepFilter(subject="0% OFF_"))).rows] == [ours[3]]
    assert (await store.list_by_subject(StepFilter(subject="0_"))).rows == []
    # The search box and the subject together: both must hold.
    both = await store.list_by_subject(StepFilter(subject="order", search="r-b"))
    assert [r.id for r in both.rows] == theirs
    # Pages: limit and offset cut the newest-first hits; the total stays.
    page = await store.list_by_subject(StepFilter(subject="order 17", run_id="r-a", limit=1, offset=1))
    assert [r.id for r in page.rows] == [ours[0]] and page.total(()) == 3


async def test_every_reader_honours_the_subject_so_a_bulk_selection_never_takes_more(store):
    """list_steps (a bulk close's selection) and count_by_status answer a filter with a
    subject from the subject scan: a filter the store ignored would widen a close to every row."""
    wanted = [s.id for s in await unknown_steps(store, 2, run_id="r-bulk", subject="Refund for order 9")]
    others = [s.id for s in await unknown_steps(store, 3, run_id="r-bulk", subject="Welcome aboard")]
    rows, total = await store.list_steps(StepFilter(statuses=(Status.UNKNOWN,), subject="REFUND", limit=None))
    assert sorted(r.id for r in rows) == sorted(wanted) and total == 2
    assert not set(others) & {r.id for r in rows}
    counts = await store.count_by_status(StepFilter(subject="refund"))
    assert counts["unknown"].n == 2 and counts["unknown"].exact and counts["pending"].n == 0


async def test_a_scan_that_reaches_its_cap_says_older_steps_were_not_searched(store, monkeypatch):
    """The scan reads at most SUBJECT_SCAN_CAP steps (here 3), newest first: an older match is
    not found, the answer says it was cut, and the counts are not exact."""
    monkeypatch.setattr(store_steps, "SUBJECT_SCAN_CAP", 3)
    made = await _enqueue(store, ["old match", "newer", "newer", "newest match"], run_id="r-cap")
    found = await store.list_by_subject(StepFilter(subject="match", run_id="r-cap"))
    assert [r.id for r in found.rows] == [made[3]]  # the oldest match is past the cap
    assert found.scanned == 3 and found.cut
    counts = await store.count_by_status(StepFilter(subject="match", run_id="r-cap"))
    assert counts["pending"].n == 1 and not counts["pending"].exact


@pytest.mark.parametrize("subject", ["ünïcode Straße", "ÜNÏCODE STRASSE"])
async def test_a_subject_with_non_ascii_letters_is_matched_in_lower_case(store, subject):
    """lower() on both sides (the database's own case rules): Ü finds ü. ß and SS are not the
    same letters to lower(), so the second finds nothing: the filter does not pretend they are."""
    [made] = await _enqueue(store, ["Grüße: ünïcode straße"], run_id="r-u")
    found = await store.list_by_subject(StepFilter(subject=subject, run_id="r-u"))
    assert [r.id for r in found.rows] == ([made] if "ß" in subject else [])
