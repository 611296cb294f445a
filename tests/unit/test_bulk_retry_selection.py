"""A bulk requeue of rejected rows (ops/app/service/operators.py's Selection): only a retry, and only a
preview or exactly the ids a preview showed; a filter over rejected rows is never applied as of now."""

from __future__ import annotations

import pytest

from evq.ops.app.service import Selection
from evq.worker.errors import InvalidRequest
from evq.worker.resolution import Resolution

RETRY = Resolution.parse("retry", "the provider is back")
REJECT = Resolution.parse("rejected", "bounced")


def test_a_bulk_retry_of_rejected_rows_is_a_preview_or_exactly_its_ids():
    by_filter = Selection(statuses=("rejected",), filters={"run_id": "r"}, limit=500)
    by_filter.check()
    assert by_filter.requeue(RETRY, dry_run=True) is True
    with pytest.raises(InvalidRequest, match="acts on the ids a preview showed"):
        by_filter.requeue(RETRY, dry_run=False)
    assert Selection(statuses=("rejected",), ids=(3, 4)).requeue(RETRY, dry_run=False) is True


def test_rejected_rows_are_only_retried_and_other_states_still_refused():
    with pytest.raises(InvalidRequest, match="can only be retried"):
        Selection(statuses=("rejected",), ids=(3,)).requeue(REJECT, dry_run=False)
    assert Selection(statuses=("unknown",), ids=(3,)).requeue(REJECT, dry_run=False) is False
    with pytest.raises(InvalidRequest, match="only unknown rows can be resolved"):
        Selection(statuses=("accepted",)).check()
