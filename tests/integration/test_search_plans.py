"""step_list and step_count_by_status at scale (PostgreSQL only): each search form reads its
index (a BitmapOr, no scan of email_steps; the key name index-only), a state's page walks its index backwards under
the LIMIT, and a total past COUNT_CAP is counted only that far. The figures at a million
rows are in docs/design.md, "Search"; these 30,000 rows only make the planner choose as it
would there."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from evq.adapters.postgres.queries import Q
from evq.adapters.postgres.store import PostgresStore
from evq.adapters.postgres.store.steps import SEARCH_WINDOWS, _filter_params
from evq.worker.ports import COUNT_CAP, StatusCount, StepFilter
from evq.worker.states import Status
from tests.acceptance.conftest import Evq, make_key
from tests.clones import Dropper, Filled, database_url
from tests.web.support import serving

ROWS = 30_000


def _fill_many(url: str) -> None:
    """ROWS steps: every 100th unknown, every 200th held, the rest accepted; a domain every
    10th row; the decisions named by 20 keys."""
    with psycopg.connect(url) as conn:
        conn.execute(  # no parameters: a script of several statements, sent as text
            f"""
            INSERT INTO decisions (id, run_id, step_id, actor)
            SELECT g, 'r' || (g / 100), 's' || g, 'key-' || (g % 20) FROM generate_series(1, {ROWS}) g;
            INSERT INTO email_steps (id, run_id, step_id, decision_id, idempotency_key, message_id, provider,
                                     payload, payload_sha256, status, closed_at, attempts, first_attempt_at,
                                     unknown_since, held_since, provider_message_id, created_at)
            SELECT g, 'r' || (g / 100), 's' || g, g, 'k' || g, '<m' || g || '@x>', 'smtp',
                   jsonb_build_object('to', jsonb_build_array(jsonb_build_object('email',
                       'u' || g || CASE WHEN g % 10 = 0 THEN '@big.example' ELSE '@d' || g || '.example' END))),
                   repeat('a', 64), st,
                   CASE WHEN st = 'accepted' THEN now() END,
                   CASE WHEN st = 'held' THEN 0 ELSE 1 END,
                   CASE WHEN st = 'held' THEN NULL ELSE now() END,
                   CASE WHEN st = 'unknown' THEN now() END,
                   CASE WHEN st = 'held' THEN now() END,
                   CASE WHEN st = 'accepted' THEN 'pm' || g END,
                   now() - interval '1 day' + g * interval '1 second'
            FROM (SELECT g, CASE WHEN g % 100 = 1 THEN 'unknown' WHEN g % 200 = 2 THEN 'held'
                                 ELSE 'accepted' END AS st
                  FROM generate_series(1, {ROWS}) g) x;
            INSERT INTO step_keys (idempotency_key, id, run_id, step_id, message_id, provider, payload_sha256,
                                   created_at)
            SELECT idempotency_key, id, run_id, step_id, message_id, provider, decode(payload_sha256, 'hex'),
                   created_at
            FROM email_steps;
            ANALYZE email_steps; ANALYZE decisions; ANALYZE step_keys;
            """
        )


# Each data set is filled once per module (per xdist worker that runs its tests) and cloned for
# every test that asks (tests/clones.py, Filled): each test still has its own copy to change, the
# planner statistics of the fill included, and the module no longer fills 30,000 rows per test
# (10 s each on a loaded machine; about 0.3 s a clone).
def _data(pg_server: str, base: str, what: str, dropper: Dropper, fill: Callable[[str], None]) -> Iterator[Filled]:
    filled = Filled(pg_server, base, f"evq_{what}_{os.getpid()}_{secrets.token_hex(3)}", dropper)
    try:
        fill(database_url(pg_server, filled.name))
        yield filled
    finally:
        filled.close()


def _clone(pg_server: str, data: Filled) -> Iterator[str]:
    name = data.clone()
    try:
        yield database_url(pg_server, name)
    finally:
        data.give_back(name)


@pytest.fixture(scope="module")
def _many_data(pg_server: str, template_db: str, _dropper: Dropper) -> Iterator[Filled]:
    yield from _data(pg_server, template_db, "many", _dropper, _fill_many)


@pytest.fixture
def many(pg_server: str, _many_data: Filled) -> Iterator[str]:
    """A database of its own holding _fill_many's rows."""
    yield from _clone(pg_server, _many_data)


def _params(where: StepFilter, since: datetime | None = None) -> dict[str, Any]:
    """step_list's parameters as list_steps passes them, with ``since`` its window (None: none)."""
    return {
        **_filter_params(where),
        "now": None,
        "statuses": [str(s) for s in where.statuses] or None,
        "limit": where.limit,
        "offset": where.offset,
        "window": None if where.limit is None else where.limit + where.offset,
        "search_since": since,
    }


def _plan(url: str, where: StepFilter, query: str = "step_list", since: datetime | None = None) -> dict[str, Any]:
    params = _params(where, since)
    with psycopg.connect(url) as conn:
        row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q[query], params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


def _scanned(plan: dict[str, Any]) -> list[str]:
    """The scans of email_steps that ran, as "node type: index"."""
    return [
        f"{n['Node Type']}: {n.get('Index Name', '')}"
        for n in _nodes(plan)
        if n.get("Relation Name") == "email_steps" and n.get("Actual Loops", 0) > 0
    ]


@pytest.mark.parametrize(
    "text, index",
    [
        ("u77@d77.example", "ix_email_steps_recipient_keys"),
        ("big.example", "ix_email_steps_recipient_keys"),
        # The Message-ID is the key ledger's (insert-once): its step's id, then the primary key.
        ("m123@x", "uq_step_keys_message_id"),
        ("pm555", "ix_email_steps_provider_message_id"),
        ("k999", "uq_email_steps_idempotency_key"),
        ("r7", "uq_email_steps_run_id_step_id"),
        ("4242", "pk_email_steps"),
    ],
)
def test_each_search_form_reads_its_index_through_a_bitmap_or(many, text, index):
    plan = _plan(many, StepFilter(search=text))
    kinds = {n["Node Type"] for n in _nodes(plan)}
    indexes = {n.get("Index Name") for n in _nodes(plan) if n["Node Type"] == "Bitmap Index Scan"}
    ledger = {n.get("Index Name") for n in _nodes(plan) if n.get("Relation Name") == "step_keys"}
    assert "BitmapOr" in kinds and index in indexes | ledger
    assert not [s for s in _scanned(plan) if s.startswith("Seq Scan")], _scanned(plan)


@pytest.mark.parametrize("query", ["step_list", "step_count_by_status"])
def test_the_key_name_form_reads_its_steps_from_indexes_alone(many, query):
    # A busy key's steps are most of a search's hits: their states and times come from
    # ix_email_steps_decision_id's INCLUDE columns, their decisions from ix_decisions_actor.
    plan = _plan(many, StepFilter(search="key-3"), query)
    only = {n.get("Index Name") for n in _nodes(plan) if n["Node Type"] == "Index Only Scan"}
    # (ix_decisions_actor is read index-only once decisions are vacuumed; these are not.)
    assert "ix_email_steps_decision_id" in only and "ix_decisions_actor" in {n.get("Index Name") for n in _nodes(plan)}
    heap = [
        n
        for n in _nodes(plan)
        if n["Node Type"] == "Bitmap Heap Scan" and n.get("Relation Name") == "email_steps" and n.get("Actual Loops", 0)
    ]
    assert all(n["Actual Rows"] == 0 for n in heap), heap  # the other forms' BitmapOr finds nothing


async def test_a_searchs_counts_are_every_states_hits(many):
    # step_count_by_status reads the states but accepted through one BitmapAnd and accepted up
    # to the cap; a step found by two forms (its run id is also a key's name) is counted once.
    with psycopg.connect(many) as conn:  # decisions are append-only: past their trigger, as a fixture
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE decisions SET actor = 'r7' WHERE id IN (701, 702, 1234, 1301)")
    store = await PostgresStore.open(many, max_size=2)
    try:
        for text in ("big.example", "key-3", "r7", "u77@d77.example"):
            counts = await store.count_by_status(StepFilter(search=text))
            rows, total = await store.list_steps(StepFilter(search=text, limit=None))
            assert total == len(rows) == sum(c.n for c in counts.values()), text
            for state in Status:
                assert counts[str(state)] == StatusCount(sum(r.status == state for r in rows), True), (text, state)
        # 700..799 (run r7) and 1234, 1301 (r7's key): 102 steps, 701 and 702 found twice.
        assert sum(c.n for c in (await store.count_by_status(StepFilter(search="r7"))).values()) == 102
    finally:
        await store.close()


@pytest.mark.parametrize(
    "status, index",
    [
        (Status.ACCEPTED, "ix_email_steps_status_created_at"),
        (Status.UNKNOWN, "ix_email_steps_unknown_since"),
        (Status.HELD, "ix_email_steps_held"),
    ],
)
def test_a_states_page_walks_its_index_under_the_limit(many, status, index):
    plan = _plan(many, StepFilter(statuses=(status,), limit=50))
    walks = [n for n in _nodes(plan) if n.get("Index Name") == index and n["Node Type"] == "Index Scan"]
    assert walks and all(n["Actual Rows"] <= 51 for n in walks)
    # The count may take the table in order when nearly every row is of this state, and it
    # stops at the cap.
    seqs = [n for n in _nodes(plan) if n["Node Type"] == "Seq Scan" and n.get("Actual Loops", 0) > 0]
    assert all(n["Actual Rows"] <= COUNT_CAP + 1 for n in seqs)


def test_the_unfiltered_page_reads_no_more_than_a_page_of_each_state(many):
    plan = _plan(many, StepFilter(limit=50))
    read = [n for n in _nodes(plan) if n.get("Relation Name") == "email_steps" and n.get("Actual Loops", 0) > 0]
    page_reads = [n for n in read if n.get("Index Name") != "pk_email_steps" and n["Node Type"] == "Index Scan"]
    assert page_reads and all(n["Actual Rows"] <= 51 for n in page_reads)


async def test_a_total_past_the_cap_is_counted_only_that_far(many):
    store = await PostgresStore.open(many, max_size=2)
    try:
        rows, total = await store.list_steps(StepFilter(statuses=(Status.ACCEPTED,), limit=5))
        assert total == COUNT_CAP + 1 and len(rows) == 5
        _, total = await store.list_steps(StepFilter(search="@big.example", limit=5))
        assert total == ROWS // 10  # 3,000: under the cap, exact
        counts = await store.count_by_status(StepFilter())
        assert counts["accepted"] == StatusCount(COUNT_CAP, False)
        assert counts["unknown"] == StatusCount(ROWS // 100, True) and counts["held"] == StatusCount(150, True)
        assert counts["pending"] == StatusCount(0, True)
    finally:
        await store.close()


def _make_recent(url: str) -> None:
    """`many`'s rows, its steps created one a second up to now (the newest hour: 3,600 of them), and
    four decisions named r7 (two of them run r7's, 701 and 702)."""
    with psycopg.connect(url) as conn:
        conn.execute(f"UPDATE email_steps SET created_at = now() - ({ROWS} - id) * interval '1 second'")
        conn.execute("SET session_replication_role = replica")  # decisions are append-only
        conn.execute("UPDATE decisions SET actor = 'r7' WHERE id IN (701, 702, 1234, 1301)")
        conn.execute("ANALYZE email_steps")


@pytest.fixture(scope="module")
def _recent_data(pg_server: str, _many_data: Filled, _dropper: Dropper) -> Iterator[Filled]:
    # "Up to now" is when the module's first such test ran: the tests after it see the newest
    # hour shifted by the module's minutes at most, and the checks below hold for any shift
    # well under the hour (the pages are compared with every hit read and sorted at that moment).
    yield from _data(pg_server, _many_data.name, "recent", _dropper, _make_recent)


@pytest.fixture
def recent(pg_server: str, _recent_data: Filled) -> Iterator[str]:
    """A database of its own holding _make_recent's rows."""
    yield from _clone(pg_server, _recent_data)


def _unwindowed(url: str, where: StepFilter) -> tuple[list[int], int]:
    """step_list's page and total with no window: every hit read and sorted."""
    params = _params(where)
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(Q["step_list"], params).fetchall()
    return [r["id"] for r in rows if r["id"] is not None], rows[0]["total"]


@pytest.mark.parametrize(
    "where",
    [
        StepFilter(search="@big.example", limit=50),
        StepFilter(search="@big.example", limit=50, offset=350),  # past the first hour's 360 hits
        StepFilter(search="@big.example", limit=20, offset=2990),  # the last page: no window holds it
        StepFilter(search="@big.example", limit=50, offset=5000),  # past the end
        StepFilter(search="@big.example", statuses=(Status.ACCEPTED,), limit=50),
        StepFilter(search="@big.example", statuses=(Status.UNKNOWN, Status.ACCEPTED), limit=50, offset=100),
        StepFilter(search="@big.example", statuses=(Status.HELD,), limit=50),
        StepFilter(search="u77@d77.example", limit=50),  # one old hit: every window tried
        StepFilter(search="key-3", limit=50, offset=40),  # the key name's hits are never cut
        StepFilter(search="r7", limit=10),
        # No page at all: the first window is enough, so the total counts what it cut; r7's
        # steps 701 and 702 are both cut (run r7) and the key r7's: counted once.
        StepFilter(search="r7", limit=0),
        StepFilter(search="@big.example", limit=0),
    ],
)
async def test_a_windowed_search_page_is_the_page_every_hit_sorted_gives(recent, where):
    # list_steps reads a search's newest hour of hits first, then a day, then all; whichever
    # window it stops at, the page and the total are those of reading and sorting every hit.
    store = await PostgresStore.open(recent, max_size=2)
    try:
        rows, total = await store.list_steps(where)
    finally:
        await store.close()
    assert ([r.id for r in rows], total) == _unwindowed(recent, where)


def test_a_big_searchs_first_window_reads_its_newest_hits_only(recent):
    # The first window (an hour) reads, to sort, the domain's hits of that hour and its unknown
    # and held hits (the page's first rows, never cut), not its 3,000 hits' rows; the hits it
    # cut are only counted, for the total, and only up to the cap.
    hours = SEARCH_WINDOWS[0]
    assert hours is not None
    plan = _plan(recent, StepFilter(search="@big.example", limit=50), since=datetime.now(UTC) - timedelta(hours=hours))
    heap = [
        n
        for n in _nodes(plan)
        if n["Node Type"] == "Bitmap Heap Scan" and n.get("Relation Name") == "email_steps" and n.get("Actual Loops", 0)
    ]
    cut = [n["Actual Rows"] for n in heap if "created_at <" in n.get("Filter", "")]
    read = [n["Actual Rows"] for n in heap if "created_at <" not in n.get("Filter", "")]
    # 360 of the hour's 3,600 steps are the domain's; 300 unknown and 150 held steps, 1 in 10 its.
    assert read and sum(read) <= 360 + 30 + 15 + 10, read
    assert cut and sum(cut) <= COUNT_CAP + 1, cut


def _fill_scattered(url: str) -> None:
    """12,500 steps of one domain in every state, created far in the past, in the last hour
    and day, and far in the future; run ids that are also key names (a step found twice),
    and an idempotency key that is also an address's step's search text."""
    with psycopg.connect(url) as conn:
        conn.execute(
            """
            INSERT INTO decisions (id, run_id, step_id, actor)
            SELECT g, 'run' || (g % 7), 's' || g, CASE WHEN g % 3 = 0 THEN 'run' || (g % 5) ELSE 'key' END
            FROM generate_series(1, 12500) g;
            INSERT INTO email_steps (id, run_id, step_id, decision_id, idempotency_key, message_id, provider,
                                     payload, payload_sha256, status, closed_at, attempts, first_attempt_at,
                                     unknown_since, held_since, provider_message_id, created_at)
            SELECT g, 'run' || (g % 7), 's' || g, g,
                   CASE WHEN g = 11 THEN 'u1@hot.example' ELSE 'k' || g END, '<m' || g || '@x>', 'smtp',
                   jsonb_build_object('to', jsonb_build_array(jsonb_build_object('email',
                       CASE WHEN g % 13 = 0 THEN 'u1@hot.example' ELSE 'u' || g || '@hot.example' END))),
                   -- In flight: the queue row's lease (below); the step keeps pending, unattempted.
                   repeat('a', 64), CASE WHEN st = 'in_flight' THEN 'pending' ELSE st END,
                   CASE WHEN st IN ('accepted', 'rejected') THEN now() END,
                   CASE WHEN st IN ('held', 'in_flight') THEN 0 ELSE 1 END,
                   CASE WHEN st IN ('held', 'in_flight') THEN NULL ELSE now() END,
                   CASE WHEN st = 'unknown' THEN now() - g * interval '1 second' END,
                   CASE WHEN st = 'held' THEN now() - g * interval '1 second' END,
                   CASE WHEN st = 'accepted' THEN 'pm' || g END,
                   CASE g % 5 WHEN 0 THEN now() - interval '10 years' - g * interval '1 second'
                              WHEN 1 THEN now() - g * interval '0.2 second'
                              WHEN 2 THEN now() - interval '2 hours' - g * interval '5 second'
                              WHEN 3 THEN now() + interval '10 years' + (g % 97) * interval '1 second'
                              ELSE now() - interval '3 days' - (g % 50) * interval '1 second' END
            FROM (SELECT g, (ARRAY['held', 'pending', 'in_flight', 'retryable', 'unknown', 'accepted', 'rejected',
                                   'accepted', 'accepted'])[1 + (g * 7919) % 9] AS st
                  FROM generate_series(1, 12500) g) x;
            INSERT INTO step_queue (id, provider, attempts, first_attempt_at, lease_token, lease_owner,
                                    lease_expires_at)
            SELECT g, 'smtp', 1, now(),
                   CASE WHEN st = 'in_flight' THEN gen_random_uuid() END,
                   CASE WHEN st = 'in_flight' THEN 'w' END,
                   CASE WHEN st = 'in_flight' THEN now() + interval '1 hour' END
            FROM (SELECT g, (ARRAY['held', 'pending', 'in_flight', 'retryable', 'unknown', 'accepted', 'rejected',
                                   'accepted', 'accepted'])[1 + (g * 7919) % 9] AS st
                  FROM generate_series(1, 12500) g) x
            WHERE st IN ('pending', 'in_flight', 'retryable');
            ANALYZE email_steps; ANALYZE decisions; ANALYZE step_queue;
            """
        )


@pytest.fixture(scope="module")
def _scattered_data(pg_server: str, template_db: str, _dropper: Dropper) -> Iterator[Filled]:
    yield from _data(pg_server, template_db, "scattered", _dropper, _fill_scattered)


@pytest.fixture
def scattered(pg_server: str, _scattered_data: Filled) -> Iterator[str]:
    """A database of its own holding _fill_scattered's rows."""
    yield from _clone(pg_server, _scattered_data)


@pytest.fixture(scope="module")
def every_hit_sorted(
    pg_server: str, _scattered_data: Filled
) -> Iterator[Callable[[StepFilter], tuple[list[int], int]]]:
    """_unwindowed on _fill_scattered's rows, read once per filter in the module, on a clone of
    its own: the tests that compare with it only read their clones, which hold the same rows
    (one fill, cloned), so a filter's every hit sorted is one answer for all of them. The tests
    ask the same filters under four `now`s and at many window edges: each read once, not each time."""
    url = next(clone := _clone(pg_server, _scattered_data))
    memo: dict[StepFilter, tuple[list[int], int]] = {}

    def read(where: StepFilter) -> tuple[list[int], int]:
        if where not in memo:
            memo[where] = _unwindowed(url, where)
        return memo[where]

    yield read
    clone.close()


_NOWS = [None, datetime(2001, 1, 1, tzinfo=UTC), datetime.now(UTC) + timedelta(days=20 * 365), datetime.now(UTC)]


# Slow (tens of seconds loaded): started first under xdist (tests/conftest.py), not in a run's last minute.
@pytest.mark.slow
@pytest.mark.parametrize("now", _NOWS, ids=["now", "before-all", "after-all", "explicit"])
async def test_a_windowed_search_agrees_with_every_hit_sorted_whatever_the_data(scattered, every_hit_sorted, now):
    cases: list[StepFilter] = []
    for text in ("hot.example", "u1@hot.example", "run3", "run4", "key"):
        for statuses in ((), (Status.UNKNOWN, Status.ACCEPTED), (Status.HELD, Status.PENDING), (Status.REJECTED,)):
            for limit, offset in ((50, 0), (50, 1), (1, 0), (10, 2790), (100, 5000), (None, 0), (0, 0), (3, 12000)):
                cases.append(StepFilter(search=text, statuses=statuses, limit=limit, offset=offset))
    store = await PostgresStore.open(scattered, max_size=2)
    try:
        bad = []
        for where in cases:
            rows, total = await store.list_steps(where, now=now)
            want = every_hit_sorted(where)
            if ([r.id for r in rows], total) != want:
                bad.append((where, total, want[1]))
    finally:
        await store.close()
    assert not bad, bad[:5]


@pytest.mark.parametrize(
    "search, statuses, limit, offset",
    [
        ("hot.example", (), 50, 0),
        ("hot.example", (), 20, 3000),
        ("hot.example", ("unknown", "accepted"), 7, 1),
        ("u1@hot.example", (), 50, 0),
        ("run3", ("rejected",), 10, 5),
    ],
)
def test_the_cli_and_the_http_api_page_a_windowed_search_as_the_store(
    scattered, every_hit_sorted, search, statuses, limit, offset
):
    evq = Evq(scattered, api_key=make_key(scattered, "test-admin", "admin", created_by=None))
    where = StepFilter(search=search, statuses=tuple(Status(s) for s in statuses), limit=limit, offset=offset)
    want_ids, want_total = every_hit_sorted(where)
    status_args = [a for s in statuses for a in ("--status", s)]
    # Read as JSON, not through the contract's check: these hand-made rows (no subject, no sender) are
    # not what enqueue writes; what matters here is which ids and which total.
    done = evq.run(
        "steps", "list", "--search", search, *status_args, "--limit", str(limit), "--offset", str(offset), "-o", "json"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cli = json.loads(done.stdout)
    assert ([s["id"] for s in cli["data"]], cli["meta"]["total"]) == (want_ids, min(want_total, COUNT_CAP))
    with serving(scattered) as served:
        reader = served.client(make_key(scattered, "reader", "agent"))
        params = [("q", search), ("limit", str(limit)), ("offset", str(offset)), *(("status", s) for s in statuses)]
        answer = reader.get("/v1/steps", params=params)
        assert answer.status_code == 200, answer.text[:2000]
        page = answer.json()
    assert ([s["id"] for s in page["data"]], page["meta"]["total"]) == (
        [s["id"] for s in cli["data"]],
        cli["meta"]["total"],
    )
    assert page["meta"]["total_exact"] == cli["meta"]["total_exact"] == (want_total <= COUNT_CAP)


# Slow (tens of seconds loaded): started first under xdist (tests/conftest.py), not in a run's last minute.
@pytest.mark.slow
async def test_a_hit_created_exactly_at_a_windows_edge_is_on_the_page_once(scattered, every_hit_sorted):
    # `now` put so that a window's edge (now less an hour, less a day) is some hit's created_at
    # to the microsecond: that hit is in the window (>=), never both kept and counted as cut.
    with psycopg.connect(scattered) as conn:
        edges = [
            r[0]
            for r in conn.execute(
                "SELECT created_at FROM steps_now WHERE status NOT IN ('unknown', 'held')"
                " AND id IN (7, 12, 101, 2002, 4004, 9999) ORDER BY id"
            ).fetchall()
        ]
    store = await PostgresStore.open(scattered, max_size=2)
    try:
        for edge in edges:
            for hours in (h for h in SEARCH_WINDOWS if h is not None):
                now = edge + timedelta(hours=hours)
                for limit, offset in ((50, 0), (5, 100), (1, 2499), (10, 7000)):
                    where = StepFilter(search="hot.example", limit=limit, offset=offset)
                    rows, total = await store.list_steps(where, now=now)
                    assert ([r.id for r in rows], total) == every_hit_sorted(where), (edge, hours, where)
    finally:
        await store.close()
