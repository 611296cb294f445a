"""A partition's drop reads its seal and its newest row under the partition's lock, under READ COMMITTED only; a give-back that finds no seal is not an error; a partition holds at most a billion step ids (issue 19).

Revision ID: 0025_partition_drop_lock
Revises: 0024_guards_when
Create Date: 2026-12-03

``evq_evidence_drop`` (0022) read whether its partition was sealed in the same statement that
first locked the partition (``pg_get_expr`` of its bounds takes ACCESS SHARE). A statement's
snapshot is taken before it waits for a lock, so when the drop queued behind a session
holding the partition, a give-back (``evq_evidence_unseal``: another evq prune's drop that
timed out) could take the seal away and commit while the drop waited, and the drop went on
believing the partition sealed:

- a step of the range reopened meanwhile: the drop saw it open and failed on removing a seal
  that was gone (``trigger "evidence_sealed" ... does not exist``) instead of saying "not
  dropped". The partition was kept, but evq prune stopped with an error;
- no step reopened, but history was added for a closed one (a late delivery event, a late
  answer): the drop's checks passed and the partition went with that row in it.

The drop now locks the partition first, in a statement of its own, and reads the seal after:
its snapshot is then newer than any give-back that got in before the lock, and holding SHARE
UPDATE EXCLUSIVE it keeps any later one out (removing a trigger takes ACCESS EXCLUSIVE) until it
commits. That mode conflicts with itself, so a second drop of the partition waits for the first
(two holding ACCESS SHARE each deadlocked on DROP TABLE behind a reader, and one evq prune
stopped with the error), and neither readers nor writers wait for it. A partition found
unsealed, or gone (another evq prune dropped it, before or while this one waited), is "not
dropped", not an error. Removing a seal says ``IF EXISTS`` in both functions.

The seal checks that nothing was written in its partition since the cutoff before its trigger
waits for the partition's writers: a late row whose writer had not yet committed was sealed in.
The drop now counts its rows under its lock together with the newest one's time, and a row
written since the cutoff gives the partition back, "not dropped".

Both lean on READ COMMITTED, each statement seeing what committed before it: under REPEATABLE
READ or SERIALIZABLE (``default_transaction_isolation`` set on the database or the role) the
whole call reads one snapshot taken before it waited, and a give-back committed meanwhile went
unseen. The seal and the drop refuse any other isolation level.

``evq_evidence_partitions_ahead`` took any size: a careless call could make one partition
covering every future step, after which retention never drops a partition again. Sizes above
1,000,000,000 step ids (ten days at 100 million sends a day) are refused, as
``EVQ_EVIDENCE_PARTITION_STEPS`` above that is.

The functions are rewritten from their own definitions (``pg_get_functiondef``), so their
owner, grants, ``SECURITY DEFINER`` and search path stay as 0022 left them; each edit checks
it finds the text it replaces. Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025_partition_drop_lock"
down_revision: str | Sequence[str] | None = "0024_guards_when"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOST_STEPS = 1_000_000_000

_DROP_READ_0022 = """    SELECT * INTO p FROM evq_evidence_partitions() x WHERE x.name = p_partition;
    IF NOT FOUND OR NOT p.sealed THEN
        RAISE EXCEPTION 'evq: % is not a sealed evidence partition', p_partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
"""
_READ_COMMITTED = """    -- Each read below must see what committed before it (READ COMMITTED): under one snapshot
    -- taken when the call began, a give-back or a late row committed while it waited for the
    -- partition would go unseen (0025).
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'evq: evidence partitions are sealed and dropped only under READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'run it in a READ COMMITTED transaction (check default_transaction_isolation)';
    END IF;
"""
_SEAL_LOOP = (
    "    FOR p IN SELECT * FROM evq_evidence_partitions() x WHERE x.lo > coalesce(p_after, -1) ORDER BY x.lo LOOP\n"
)
_DECLARE_0022 = "    n bigint;\n"
_DECLARE = "    n bigint;\n    newest timestamptz;\n"
_COUNT_0022 = "    EXECUTE format('SELECT count(*) FROM %I.%I', ns, p.name) INTO n;\n"
_COUNT = """    -- Counted under the lock, with its newest row's time: a late row whose writer had not
    -- committed when the seal looked for recent rows (the seal's trigger then waited for it)
    -- is in the partition. It gives the partition back, as an open step does (0025).
    EXECUTE format('SELECT count(*), max(e.created_at) FROM %I.%I e', ns, p.name) INTO n, newest;
    IF newest >= p_cutoff THEN
        EXECUTE format('DROP TRIGGER IF EXISTS evidence_sealed ON %I.%I', ns, p.name);
        RETURN QUERY SELECT false, 0::bigint, p.lo, p.hi;
        RETURN;
    END IF;
"""
_DROP_READ = (
    _READ_COMMITTED
    + """    -- An evidence partition's name (evidence_steps_<lo>, as the keeper names them). One that
    -- no longer exists was dropped by another evq prune: "not dropped" below, not an error.
    IF p_partition IS NULL OR p_partition !~ '^evidence_steps_[0-9]+$'
       OR (to_regclass(format('%I.%I', ns, p_partition)) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                           WHERE i.inhparent = 'evidence'::regclass AND c.relname = p_partition)) THEN
        RAISE EXCEPTION 'evq: % is not an evidence partition', p_partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The partition's lock first, in a statement of its own (0025): the seal read below then
    -- sees every give-back that got in before it, and none can come after (removing the
    -- trigger needs ACCESS EXCLUSIVE) until this transaction ends. SHARE UPDATE EXCLUSIVE lets
    -- readers and writers by and makes a second drop wait for this one: two drops holding a
    -- shared lock each would deadlock on DROP TABLE behind a reader.
    PERFORM set_config('lock_timeout', '5s', true);
    BEGIN
        EXECUTE format('LOCK TABLE %I.%I IN SHARE UPDATE EXCLUSIVE MODE', ns, p_partition);
    EXCEPTION WHEN undefined_table THEN
        RETURN QUERY SELECT false, 0::bigint, NULL::bigint, NULL::bigint;  -- another evq prune dropped it
        RETURN;
    END;
    SELECT * INTO p FROM evq_evidence_partitions() x WHERE x.name = p_partition;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, 0::bigint, NULL::bigint, NULL::bigint;
        RETURN;
    ELSIF NOT p.sealed THEN
        -- Given back by another evq prune (or by hand) while this one waited: not dropped.
        RETURN QUERY SELECT false, 0::bigint, p.lo, p.hi;
        RETURN;
    END IF;
"""
)
_SEAL_OFF_0022 = "EXECUTE format('DROP TRIGGER evidence_sealed ON %I.%I'"
_SEAL_OFF = "EXECUTE format('DROP TRIGGER IF EXISTS evidence_sealed ON %I.%I'"

_AHEAD_CHECK_0022 = """    IF p_steps IS NULL OR p_steps < 1 THEN
        RAISE EXCEPTION 'evq: an evidence partition holds a positive number of step ids, not %', p_steps
"""
_AHEAD_CHECK = f"""    IF p_steps IS NULL OR p_steps < 1 OR p_steps > {MOST_STEPS} THEN
        RAISE EXCEPTION 'evq: an evidence partition holds from 1 to {MOST_STEPS} step ids, not %', p_steps
"""

DROP = "evq_evidence_drop(text, timestamptz, text, uuid, integer)"
SEAL = "evq_evidence_seal(timestamptz, bigint)"
UNSEAL = "evq_evidence_unseal(text)"
AHEAD = "evq_evidence_partitions_ahead(bigint)"


def _definition(signature: str) -> str:
    return str(
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef(CAST(:f AS regprocedure))"), {"f": signature})
        .scalar_one()
    )


def _edit(signature: str, edits: Sequence[tuple[str, str, int]]) -> None:
    """Replace each ``old`` (found exactly ``count`` times) by ``new`` in the function's own text."""
    text = _definition(signature)
    for old, new, count in edits:
        if text.count(old) != count:
            raise RuntimeError(f"{signature} does not read as this migration expects (looking for {old[:60]!r})")
        text = text.replace(old, new)
    op.execute(text)


_DROP_EDITS = [
    (_DROP_READ_0022, _DROP_READ, 1),
    (_SEAL_OFF_0022, _SEAL_OFF, 1),
    (_DECLARE_0022, _DECLARE, 1),
    (_COUNT_0022, _COUNT, 1),
]
_SEAL_EDITS = [(_SEAL_LOOP, _READ_COMMITTED + _SEAL_LOOP, 1)]


def _undo(edits: Sequence[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    return [(new, old, count) for old, new, count in reversed(edits)]


def upgrade() -> None:
    _edit(DROP, _DROP_EDITS)
    _edit(SEAL, _SEAL_EDITS)
    _edit(UNSEAL, [(_SEAL_OFF_0022, _SEAL_OFF, 1)])
    _edit(AHEAD, [(_AHEAD_CHECK_0022, _AHEAD_CHECK, 1)])


def downgrade() -> None:
    _edit(AHEAD, [(_AHEAD_CHECK, _AHEAD_CHECK_0022, 1)])
    _edit(UNSEAL, [(_SEAL_OFF, _SEAL_OFF_0022, 1)])
    _edit(SEAL, _undo(_SEAL_EDITS))
    _edit(DROP, _undo(_DROP_EDITS))
