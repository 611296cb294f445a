"""Each key's event feed (key_events, issue 15), against the PostgreSQL store: every rejection,
unknown and operator verdict on a step lands in the feed of the key that enqueued it,
whether or not anyone is to be notified, and nothing else does."""

from __future__ import annotations

from dataclasses import replace

from evq.worker.notices import NoticeConfig
from evq.worker.outcomes import Accepted, Rejected, Unknown
from evq.worker.request import Actor
from evq.worker.resolution import Resolution
from tests.conformance.helpers import claim, settle
from tests.support import valid

AGENT = Actor(interface="http", key_id="0123456789ab", name="agent-7", approval="policy")
OTHER = Actor(interface="mcp", key_id="0123456789cd", name="agent-8", approval="policy")


async def test_rejections_unknowns_and_verdicts_land_in_the_enqueuing_keys_feed(store):
    store.notices = NoticeConfig()  # no notify address anywhere: the feed is told anyway
    rejected = await store.enqueue(replace(valid(), actor=AGENT))
    unknown = await store.enqueue(replace(valid(), actor=AGENT))
    accepted = await store.enqueue(replace(valid(), actor=AGENT))
    others = await store.enqueue(replace(valid(), actor=OTHER))
    keyless = await store.enqueue(valid())
    by_id = {s.id: s for s in await claim(store, limit=10)}
    outcomes = {
        rejected.id: Rejected("550 no such user"),
        unknown.id: Unknown("connection reset after DATA"),
        accepted.id: Accepted("pm-1"),
        others.id: Rejected("554 spam"),
        keyless.id: Rejected("550 gone"),
    }
    await store.record([settle(by_id[i], o) for i, o in outcomes.items()], actor="worker-1")
    await store.resolve(
        unknown.id, Resolution.parse("rejected", "not in the provider's log"), actor="ada", default_max_attempts=3
    )

    mine, total = await store.key_events(since=0, limit=100, key_id=AGENT.key_id)
    assert total == 3 and [(e["step"], e["kind"], e["status"]) for e in mine] == [
        (rejected.id, "rejected", "rejected"),
        (unknown.id, "unknown", "unknown"),
        (unknown.id, "verdict", "rejected"),
    ]
    assert mine[0]["actor"] == "worker-1" and mine[2]["actor"] == "ada"
    assert mine[2]["detail"] == "not in the provider's log"
    assert all(e["key_id"] == AGENT.key_id and e["evidence_id"] for e in mine)
    # The cursor: only what came after it.
    after, total = await store.key_events(since=mine[0]["id"], limit=100, key_id=AGENT.key_id)
    assert [e["id"] for e in after] == [e["id"] for e in mine[1:]] and total == 2
    # A page: offset skips, limit bounds, the total counts every event after the cursor.
    page, total = await store.key_events(since=0, limit=1, offset=1, key_id=AGENT.key_id)
    assert [e["id"] for e in page] == [mine[1]["id"]] and total == 3
    assert await store.key_events(since=0, limit=1, offset=3, key_id=AGENT.key_id) == ([], 3)
    # Another key's events are not in this key's feed; every key's (and keyless) are in the whole feed.
    theirs, _ = await store.key_events(since=0, limit=100, key_id=OTHER.key_id)
    assert [e["step"] for e in theirs] == [others.id]
    every, total = await store.key_events(since=0, limit=100, every=True)
    assert total == len(every) == 5 and {e["step"] for e in every} == {rejected.id, unknown.id, others.id, keyless.id}
    assert [e["key_id"] for e in every if e["step"] == keyless.id] == [None]
