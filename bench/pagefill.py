"""The ops-pages mode's database: a million steps (or --steps) as a week of real use leaves them,
made with SQL in a few big statements (INSERT ... SELECT generate_series), in step-id chunks.

The mix (``Mix``): about 95% accepted (the remainder), 2% rejected, 1% unknown, 0.5% held, 1%
pending, 0.5% retryable and a few in flight. Closed and unknown steps spread over the last 7
days; the open ones (held, pending, retryable, in flight) are every other one of the newest
(2 x their number: about the last 7 hours at a million), as a queue's are, while sends still
close beside them. Within each of the two sets a step's status comes from a multiplicative
permutation of its position (``Mix.status_of``, the same arithmetic as the SQL), so every state
is spread over its span rather than bunched in one slice of time, and the counts are exact.

Each step has its decision (one of ~20 API keys, real keys made through the store, so the
trigger's key events name real key ids), one recipient (5% at one big domain, the rest over
5,000 domains), and its evidence in time order (attempt_started, provider_response, a second
attempt for half the accepted ones, lease_expired for some unknown ones): about 3 rows a step,
inserted sorted by time so the evidence BRIN index stays as tight as a worker leaves it.
queue_samples gets one row a minute for the 7 days. Every row satisfies the schema's CHECKs.

The send rollups (send_rollups, what the overview's sends and provider charts read instead of
every evidence row) are made as a running sampler leaves them: by the store's own
``roll_up_sends``, a day at a time over the 7 days (a sampler's first run reads 24 h back, each
later one from its watermark), the last run at the fill's end, so only the last few minutes
are read live, as on a system whose workers roll up every minute. Without them a page would
read the whole window live, which no running evq does (and the first minute's rollup of
`evq serve` would land in the middle of the timed reads).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

DAYS = 7
KEY_NAMES = 20
DOMAINS = 5_000
BIG_DOMAIN = "bigmail.example.com"  # 1 recipient in 20: the search by domain with many matches
CHUNK = 100_000
# The shares of the mix; accepted is the remainder (about 95%).
SHARES = {"rejected": 0.02, "unknown": 0.01, "held": 0.005, "pending": 0.01, "retryable": 0.005}
HEAD = ("rejected", "unknown", "accepted")  # spread over the 7 days
TAIL = ("held", "pending", "retryable", "in_flight")  # the newest steps
_MULTIPLIERS = (7919, 104_729, 1_299_709, 15_485_863)


def in_flight_count(steps: int) -> int:
    """A few: 3, and 10 a million."""
    return max(3, steps // 100_000)


def multiplier(size: int) -> int:
    """A multiplier coprime to ``size``: position * m mod size is then a permutation of 0..size-1."""
    return next(m for m in _MULTIPLIERS if math.gcd(m, size) == 1)


@dataclass(frozen=True)
class Mix:
    steps: int
    counts: dict[str, int]

    @classmethod
    def of(cls, steps: int) -> Mix:
        counts = {status: round(steps * share) for status, share in SHARES.items()}
        counts["in_flight"] = in_flight_count(steps)
        counts["accepted"] = steps - sum(counts.values())
        if counts["accepted"] <= 0:
            raise ValueError(f"{steps} steps are too few for the mix")
        return cls(steps, counts)

    @property
    def head(self) -> int:
        return sum(self.counts[s] for s in HEAD)

    @property
    def tail(self) -> int:
        return sum(self.counts[s] for s in TAIL)

    def bounds(self) -> dict[str, int]:
        """Each status's upper bound in its span's permuted position (the SQL's CASE)."""
        out, total = {}, 0
        for span in (HEAD, TAIL):
            total = 0
            for status in span:
                total += self.counts[status]
                out[status] = total
        return out

    def params(self) -> dict[str, int]:
        b = self.bounds()
        return {
            "head": self.head,
            "tail": self.tail,
            "m_head": multiplier(self.head),
            "m_tail": multiplier(self.tail),
            "b_rejected": b["rejected"],
            "b_unknown": b["unknown"],
            "b_held": b["held"],
            "b_pending": b["pending"],
            "b_retryable": b["retryable"],
            "start": self.steps - 2 * self.tail,
        }

    def status_of(self, g: int) -> str:
        """Step ``g``'s status (1-based), as STATUS_SQL computes it: in the newest 2 x tail ids
        every other one is open (the tail's positions), the others closed like the rest."""
        b = self.bounds()
        start = self.steps - 2 * self.tail  # the open steps' window begins after this id
        j = g - start - 1
        if g <= start or j % 2 == 0:
            pos = g if g <= start else start + j // 2 + 1
            k = ((pos - 1) * multiplier(self.head)) % self.head
            return "rejected" if k < b["rejected"] else "unknown" if k < b["unknown"] else "accepted"
        k = ((j // 2) * multiplier(self.tail)) % self.tail
        for status in TAIL:
            if k < b[status]:
                return status
        raise AssertionError("unreachable: the tail's bounds cover it")


STATUS_SQL = """CASE WHEN g <= %(start)s OR (g - %(start)s - 1) %% 2 = 0 THEN
    CASE WHEN ((pos.h - 1) * %(m_head)s) %% %(head)s < %(b_rejected)s THEN 'rejected'
         WHEN ((pos.h - 1) * %(m_head)s) %% %(head)s < %(b_unknown)s THEN 'unknown'
         ELSE 'accepted' END
  ELSE
    CASE WHEN (pos.t * %(m_tail)s) %% %(tail)s < %(b_held)s THEN 'held'
         WHEN (pos.t * %(m_tail)s) %% %(tail)s < %(b_pending)s THEN 'pending'
         WHEN (pos.t * %(m_tail)s) %% %(tail)s < %(b_retryable)s THEN 'retryable'
         ELSE 'in_flight' END
  END"""
# A step's position in its span: h among the closed and unknown ones, t among the open ones.
POSITION_SQL = """SELECT CASE WHEN g <= %(start)s THEN g ELSE %(start)s + (g - %(start)s - 1) / 2 + 1 END AS h,
       (g - %(start)s - 1) / 2 AS t"""

# One row per step: its status, creation time (evenly over the 7 days, in id order), recipient
# and key. Attempts: half the accepted steps needed two (a temporary failure first).
_BASE = f"""
SELECT g, st.status,
       %(t0)s::timestamptz + (g - 1) * (%(span)s::float8 / %(n)s) * interval '1 second' AS created,
       CASE WHEN g %% 20 = 0 THEN 'customer' || (g %% 100000) || '@{BIG_DOMAIN}'
            ELSE 'user' || (g %% 100000) || '@shop' || ((g * 31) %% {DOMAINS}) || '.example.net' END AS rcpt,
       (g %% {KEY_NAMES}) + 1 AS key_no,
       CASE WHEN st.status IN ('pending', 'held') THEN 0
            WHEN st.status = 'accepted' AND g %% 2 = 0 THEN 2 ELSE 1 END AS attempts
FROM generate_series(%(a)s::bigint, %(b)s::bigint) g
CROSS JOIN LATERAL ({POSITION_SQL}) pos
CROSS JOIN LATERAL (SELECT {STATUS_SQL} AS status) st
"""

DECISIONS = f"""
INSERT INTO decisions (id, run_id, step_id, intent, instruction_version, model, tool, rationale,
                       decided_at, created_at, actor, actor_key_id, interface)
SELECT b.g, 'run-' || (b.g / 4), 's' || b.g, 'order_confirmation', 'v3', 'model-large', 'send_email',
       jsonb_build_object('why', 'the customer placed order ' || b.g, 'confidence', 0.9),
       b.created, b.created, 'agent-' || lpad(b.key_no::text, 2, '0'), (%(key_ids)s::text[])[b.key_no], 'http'
FROM ({_BASE}) b
"""

STEPS = f"""
INSERT INTO email_steps (id, run_id, step_id, decision_id, idempotency_key, message_id, provider, payload,
    payload_sha256, status, reason, attempts, next_attempt_at,
    maybe_delivered, provider_message_id, created_at, updated_at, first_attempt_at, unknown_since, closed_at,
    held_since, hold_expires_at, hold)
SELECT b.g, 'run-' || (b.g / 4), 's' || b.g, b.g, 'bench:' || b.g, '<m' || b.g || '@mail.bench.example.org>',
       CASE WHEN b.g %% 5 < 3 THEN 'smtp' ELSE 'http' END, p.payload,
       encode(sha256(convert_to(p.payload::text, 'UTF8')), 'hex'),
       -- In flight is a lease on the queue row (QUEUE); the step's row keeps pending, unattempted.
       CASE WHEN b.status = 'in_flight' THEN 'pending' ELSE b.status END,
       CASE b.status WHEN 'accepted' THEN 'provider_accepted' WHEN 'rejected' THEN 'provider_rejected'
            WHEN 'unknown' THEN CASE WHEN b.g %% 2 = 0 THEN 'lease_expired' ELSE 'ambiguous_response' END
            WHEN 'retryable' THEN 'provider_temporary' WHEN 'held' THEN 'approval_required' END,
       CASE WHEN b.status = 'in_flight' THEN 0 ELSE b.attempts END,
       CASE WHEN b.status = 'retryable' THEN b.created + interval '5 minutes' ELSE b.created END,
       b.status = 'unknown' AND b.g %% 2 = 1,
       CASE WHEN b.status = 'accepted' THEN 'pm-' || md5(b.g::text) END,
       b.created, coalesce(t.done, b.created), CASE WHEN b.status <> 'in_flight' THEN t.first END,
       CASE WHEN b.status = 'unknown' THEN b.created + interval '1.8 seconds' END,
       CASE WHEN b.status IN ('accepted', 'rejected') THEN t.done END,
       CASE WHEN b.status = 'held' THEN b.created END,
       CASE WHEN b.status = 'held' THEN b.created + interval '2 days' END,
       CASE WHEN b.status = 'held' THEN '[{{"rule": "first_contact", "why": "first send to this domain"}}]'::jsonb END
FROM ({_BASE}) b
CROSS JOIN LATERAL (SELECT jsonb_build_object(
    'from', jsonb_build_object('email', 'orders@shop.bench.example.org', 'name', 'Bench Shop'),
    'to', jsonb_build_array(jsonb_build_object('email', b.rcpt, 'name', NULL)),
    'cc', '[]'::jsonb, 'bcc', '[]'::jsonb, 'reply_to', '[]'::jsonb,
    'subject', 'Your order ' || b.g || ' is confirmed',
    'text', 'Hello, thank you for order ' || b.g || '. It ships within two days.',
    'html', NULL, 'headers', '{{}}'::jsonb) AS payload) p
CROSS JOIN LATERAL (SELECT
    CASE WHEN b.attempts > 0 THEN b.created + interval '1 second' END AS first,
    CASE WHEN b.attempts = 2 THEN b.created + interval '61.6 seconds'
         WHEN b.attempts = 1 AND b.status <> 'in_flight' THEN b.created + interval '1.8 seconds' END AS done) t
"""

# The queue: a row for each step owed a send or under an attempt (in flight: its lease).
QUEUE = f"""
INSERT INTO step_queue (id, provider, next_attempt_at, attempts, first_attempt_at, lease_owner, lease_token,
                        lease_expires_at)
SELECT b.g, CASE WHEN b.g %% 5 < 3 THEN 'smtp' ELSE 'http' END,
       CASE WHEN b.status = 'retryable' THEN b.created + interval '5 minutes' ELSE b.created END,
       b.attempts, CASE WHEN b.attempts > 0 THEN b.created + interval '1 second' END,
       CASE WHEN b.status = 'in_flight' THEN 'bench-worker' END,
       CASE WHEN b.status = 'in_flight' THEN gen_random_uuid() END,
       CASE WHEN b.status = 'in_flight' THEN now() + interval '1 hour' END
FROM ({_BASE}) b
WHERE b.status IN ('pending', 'retryable', 'in_flight')
"""

# Each attempted step's evidence, sorted by time (steps_now: an in-flight step's attempt is its
# queue row's). The lease token of an attempt is derived from
# the step and the attempt, so its start and its answer share it and no two answers do.
EVIDENCE = """
INSERT INTO evidence (step_id, run_id, attempt, kind, actor, from_status, to_status, outcome, reason,
                      provider_message_id, lease_token, latency_ms, created_at)
SELECT s.id, s.run_id, e.attempt, e.kind, e.actor, e.from_status, e.to_status, e.outcome, e.reason,
       e.pmid, CASE WHEN e.kind <> 'lease_expired' THEN md5('lease:' || s.id || ':' || e.attempt)::uuid END,
       e.latency, s.first_attempt_at + e.after
FROM steps_now s
CROSS JOIN LATERAL (VALUES
    (1, 'attempt_started', 'bench-worker', 'pending', 'in_flight', NULL, NULL, NULL, NULL::float8,
     interval '0', true),
    (1, CASE WHEN s.reason = 'lease_expired' THEN 'lease_expired' ELSE 'provider_response' END,
     CASE WHEN s.reason = 'lease_expired' THEN 'rescuer' ELSE 'bench-worker' END, 'in_flight',
     CASE WHEN s.attempts = 2 THEN 'retryable' ELSE s.status END,
     CASE WHEN s.reason = 'lease_expired' THEN NULL WHEN s.attempts = 2 THEN 'retryable' ELSE s.status END,
     CASE WHEN s.attempts = 2 THEN 'provider_temporary' ELSE s.reason END,
     CASE WHEN s.attempts = 1 THEN s.provider_message_id END,
     CASE WHEN s.reason = 'lease_expired' THEN NULL ELSE 800.0 END,
     interval '0.8 seconds', s.status <> 'in_flight'),
    (2, 'attempt_started', 'bench-worker', 'retryable', 'in_flight', NULL, NULL, NULL, NULL,
     interval '60 seconds', s.attempts = 2),
    (2, 'provider_response', 'bench-worker', 'in_flight', 'accepted', 'accepted', 'provider_accepted',
     s.provider_message_id, 600.0, interval '60.6 seconds', s.attempts = 2)
) AS e(attempt, kind, actor, from_status, to_status, outcome, reason, pmid, latency, after, present)
WHERE s.id BETWEEN %(a)s AND %(b)s AND s.attempts > 0 AND e.present
ORDER BY s.first_attempt_at + e.after, s.id
"""

# One sample a minute for the 7 days: a queue that breathes (a daily wave), never empty.
SAMPLES = """
INSERT INTO queue_samples (at, pending, claimable, lag_seconds, in_flight, retryable, unknown,
                           unknown_oldest_seconds, held, sampled_by)
SELECT m, p, p * 9 / 10, 2 + 30 * wave, 5 + (i %% 7), 20 + (i %% 13), 50 + i / 1000, 3600 + i * 60.0,
       10 + (i %% 5), 'evq bench'
FROM generate_series(0, %(days)s * 24 * 60 - 1) i
CROSS JOIN LATERAL (SELECT date_trunc('minute', now()) - i * interval '1 minute' AS m,
                           (1 + sin(i / 229.18)) / 2 AS wave) w
CROSS JOIN LATERAL (SELECT (100 + 400 * wave)::int AS p) q
"""


@dataclass(frozen=True)
class Filled:
    steps: int
    seconds: float
    database_bytes: int
    operator_key: str
    counts: dict[str, int]


async def _roll_up(url: str, t0: datetime) -> None:
    """The rollups of the 7 days as a sampler running all along made them: one run a day (a
    run reads at most 24 h back), then one at the real now."""
    from evq.adapters.postgres.store import PostgresStore
    from evq.worker.window import KEEP_SAMPLES

    store = await PostgresStore.open(url, max_size=1)
    try:
        for day in range(1, DAYS + 1):
            await store.roll_up_sends(keep_seconds=KEEP_SAMPLES, now=t0 + timedelta(days=day))
        await store.roll_up_sends(keep_seconds=KEEP_SAMPLES)
    finally:
        await store.close()


async def _make_keys(url: str) -> tuple[list[str], str]:
    """The agents' keys (their ids go into the decisions) and an operator key to sign in with,
    made through the store as `evq keys create` makes them (the bootstrap: no admin key yet)."""
    from evq.adapters.postgres.store import PostgresStore
    from evq.worker.keys import Role, generate

    store = await PostgresStore.open(url, max_size=1)
    try:
        ids = []
        for n in range(1, KEY_NAMES + 1):
            key = generate()
            await store.create_key(name=f"agent-{n:02d}", role=Role.AGENT, key=key, created_by=None)
            ids.append(key.key_id)
        operator = generate()
        await store.create_key(name="ops-bench", role=Role.OPERATOR, key=operator, created_by=None)
        return ids, operator.text
    finally:
        await store.close()


def fill(url: str, steps: int, *, progress: Callable[[str], None] = lambda _: None) -> Filled:
    """Fill the (freshly migrated) database at ``url``; then VACUUM ANALYZE, as autovacuum would."""
    mix = Mix.of(steps)
    started = time.perf_counter()
    key_ids, operator = asyncio.run(_make_keys(url))
    span = DAYS * 86_400 - 60  # the newest step a minute ago: the last hour has sends too
    with psycopg.connect(url, autocommit=True) as conn:
        [t0] = conn.execute("SELECT now() - make_interval(days => %s)", (DAYS,)).fetchone() or [None]
        base: dict[str, Any] = {**mix.params(), "t0": t0, "span": span, "n": steps, "key_ids": key_ids}
        for a in range(1, steps + 1, CHUNK):
            b = min(steps, a + CHUNK - 1)
            params = {**base, "a": a, "b": b}
            with conn.transaction():
                conn.execute(DECISIONS, params)
                conn.execute(STEPS, params)
                conn.execute(QUEUE, params)
                conn.execute(EVIDENCE, params)
            progress(f"ops-pages: {b:,} of {steps:,} steps ({time.perf_counter() - started:.0f}s)")
        conn.execute(SAMPLES, {"days": DAYS})
        progress("ops-pages: rolling up the sends as the sampler does")
        asyncio.run(_roll_up(url, t0))
        for table in ("decisions", "email_steps"):
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", (steps,))
        progress("ops-pages: VACUUM ANALYZE")
        conn.execute("VACUUM ANALYZE")
        [size] = conn.execute("SELECT pg_database_size(current_database())").fetchone() or [0]
    return Filled(steps, time.perf_counter() - started, int(size), operator, dict(mix.counts))
