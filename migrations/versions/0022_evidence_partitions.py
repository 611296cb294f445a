"""Evidence partitioned by its step's id, so retention drops whole partitions (issue 19).

Revision ID: 0022_evidence_partitions
Revises: 0021_search_key_ids
Create Date: 2026-12-02

At 100 million sends a day evq writes about 300 million evidence rows a day; deleting them a
row at a time (each through the append-only trigger) cannot keep up. Here ``evidence`` becomes a
table partitioned by RANGE (step_id):

- a step's evidence all lands in one partition, the one holding its id, so dropping a partition
  removes whole histories, never part of one. Step ids come from one sequence, in the order the
  steps were enqueued, so a partition is also a span of time;
- ``evidence_steps_<lo>`` holds the evidence of steps ``lo`` to ``hi - 1``; the first holds all the
  history already there. ``evq_evidence_partitions_ahead(steps)`` (owner's, ``SECURITY
  DEFINER``) creates the next ones, ``steps`` ids each, until four lie beyond the last step id
  handed out; the worker calls it every minute, ``evq prune`` and this migration once;
- ``evidence_overflow`` (the DEFAULT partition) takes evidence no partition covers, so a write is
  never refused because maintenance fell behind; a partition created later starts above what it
  holds. Its trigger refuses evidence for a range that retention dropped (``prune_log`` names
  it): that step's history is gone, and a new row would be the only one left;
- the primary key is ``(step_id, id)`` (a partitioned table's unique keys hold its partition
  key): it is also the index every read of a step's history uses, so the old ``(step_id, id)``
  index is gone and each evidence row writes one index entry fewer. The one-answer-per-attempt
  index becomes ``(step_id, lease_token)``: a lease token is drawn for one step, so it is the
  same rule;
- retention (worker/pruner.py) first seals a candidate partition (``evq_evidence_seal``: no step
  of its range open, no notice of one open, nothing written there since the cutoff; then a
  trigger refusing every insert into it), then ``evq_evidence_drop`` checks every step of the
  range is closed before the cutoff and drops the partition, logging it in ``prune_log``
  (``evidence_partition``). Sealed, the range cannot change under the check: every change of a
  step writes its evidence, and the seal refuses it. The steps and decisions follow by the usual
  batches (``evq_prune_batch``), with no evidence left to delete;
- ``evq_append_only`` knows a partition for its table (a partition's rows are evidence), and
  ``evq_grant_runtime`` gives the runtime role nothing on a partition (it reads and writes through
  ``evidence``) and EXECUTE on the functions above.

Self-contained on purpose (no application imports).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022_evidence_partitions"
down_revision: str | Sequence[str] | None = "0021_search_key_ids"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The default partition size, in step ids (EVQ_EVIDENCE_PARTITION_STEPS sets the next ones).
STEPS = 1_000_000

TERMINAL = "('accepted', 'rejected')"


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _closed_before(alias: str) -> str:
    # evq_prune_batch's own rule for one step (0009's ELIGIBLE, without its notices).
    return f"({alias}.status IN {TERMINAL} AND {alias}.created_at < p_cutoff AND {alias}.closed_at < p_cutoff)"


_CUTOFF_CHECK = """
    IF p_cutoff IS NULL OR p_cutoff > now() THEN
        RAISE EXCEPTION 'evq: prune cutoff % is later than the database''s clock (%)', p_cutoff, now()
            USING ERRCODE = 'invalid_parameter_value', HINT = 'compute the cutoff as now() - interval in the database';
    END IF;
"""

PARENT = """
CREATE TABLE evidence (
    id bigint NOT NULL DEFAULT nextval('evidence_id_seq'::regclass),
    step_id bigint NOT NULL,
    run_id text NOT NULL,
    attempt integer,
    kind text NOT NULL,
    actor text NOT NULL,
    from_status text,
    to_status text,
    outcome text,
    reason text,
    provider_message_id text,
    lease_token uuid,
    latency_ms double precision,
    detail jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pk_evidence PRIMARY KEY (step_id, id),
    CONSTRAINT fk_evidence_step_id_email_steps FOREIGN KEY (step_id) REFERENCES email_steps (id)
) PARTITION BY RANGE (step_id)
"""

INDEXES = [
    "CREATE INDEX ix_evidence_created_at_brin ON evidence USING brin (created_at) WITH (autosummarize = on)",
    "CREATE UNIQUE INDEX uq_evidence_answer_per_lease ON evidence (step_id, lease_token) "
    "WHERE kind IN ('provider_response', 'late_response')",
]

APPEND_ONLY_0022 = """
CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- A partition's rows are its table's (0022: evidence_steps_<lo> holds evidence).
    evq_table name := coalesce((SELECT c.relname FROM pg_class c WHERE c.oid = pg_partition_root(TG_RELID)),
                               TG_TABLE_NAME);
BEGIN
    -- The one exception (evq prune): a DELETE of evidence or decisions while the
    -- prune switch is on AND the current user is the table's owner (the switch is
    -- a setting any session can set; only evq_prune_batch, which runs as the owner,
    -- is trusted with it). Evidence only when its step is terminal.
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' AND evq_table IN ('evidence', 'decisions')
       AND coalesce(current_setting('evq.pruning', true), '') = 'on'
       AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        IF evq_table = 'decisions' THEN
            RETURN OLD;  -- the foreign key keeps every decision a step still points at
        END IF;
        IF EXISTS (SELECT 1 FROM email_steps s WHERE s.id = OLD.step_id AND s.status IN ('accepted', 'rejected')) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, evq_table
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'evidence is never changed; append a new row instead (evq prune is the only way to remove old rows)';
END
$$
"""

# 0009_runtime_role's text, for the downgrade.
APPEND_ONLY_0009 = """
CREATE OR REPLACE FUNCTION evq_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The one exception (evq prune): a DELETE of evidence or decisions while the
    -- prune switch is on AND the current user is the table's owner (the switch is
    -- a setting any session can set; only evq_prune_batch, which runs as the owner,
    -- is trusted with it). Evidence only when its step is terminal.
    IF TG_OP = 'DELETE' AND TG_LEVEL = 'ROW' AND TG_TABLE_NAME IN ('evidence', 'decisions')
       AND coalesce(current_setting('evq.pruning', true), '') = 'on'
       AND pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID), 'USAGE') THEN
        IF TG_TABLE_NAME = 'decisions' THEN
            RETURN OLD;  -- the foreign key keeps every decision a step still points at
        END IF;
        IF EXISTS (SELECT 1 FROM email_steps s WHERE s.id = OLD.step_id AND s.status IN ('accepted', 'rejected')) THEN
            RETURN OLD;
        END IF;
    END IF;
    RAISE EXCEPTION 'evq: % on % refused: the table is append-only', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'evidence is never changed; append a new row instead (evq prune is the only way to remove old rows)';
END
$$
"""


def _functions(path: str) -> list[str]:
    return [
        # Every partition but the overflow, by range, and whether retention has sealed it.
        f"""
CREATE FUNCTION evq_evidence_partitions()
RETURNS TABLE (name text, lo bigint, hi bigint, sealed boolean)
LANGUAGE sql STABLE SET search_path = {path} AS $$
    SELECT c.relname::text, m.b[1]::bigint, m.b[2]::bigint,
           EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'evidence_sealed')
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (
        SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \\(''?(-?\\d+)''?\\) TO \\(''?(-?\\d+)''?\\)') AS b
    ) m
    WHERE i.inhparent = 'evidence'::regclass AND m.b IS NOT NULL
    ORDER BY 2
$$
""",
        f"""
CREATE FUNCTION evq_evidence_partitions_ahead(p_steps bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
DECLARE
    last_id bigint := coalesce(pg_sequence_last_value(pg_get_serial_sequence('email_steps', 'id')::regclass), 0);
    top bigint := (SELECT max(p.hi) FROM evq_evidence_partitions() p);
    lo bigint;
    hi bigint;
    part text;
    made integer := 0;
    -- The function's search path starts at pg_catalog: name evidence's schema outright.
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    IF p_steps IS NULL OR p_steps < 1 THEN
        RAISE EXCEPTION 'evq: an evidence partition holds a positive number of step ids, not %', p_steps
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Creating a partition waits for a lock that every new writer of evidence would queue
    -- behind: never wait long behind a slow reader. Four partitions are kept ahead, so a
    -- call that gives up here is tried again (a minute later) long before one is needed.
    PERFORM set_config('lock_timeout', '2s', true);
    WHILE top IS NULL OR top <= last_id + 4 * p_steps LOOP
        lo := coalesce(top, 0);
        -- Evidence that found no partition waits in the overflow (maintenance fell behind):
        -- the new partition starts above it, so the overflow keeps what it holds.
        lo := greatest(lo, coalesce((SELECT max(o.step_id) + 1 FROM evidence_overflow o WHERE o.step_id >= lo), lo));
        hi := CASE WHEN top IS NULL THEN greatest(last_id + 1, lo + p_steps) ELSE lo + p_steps END;
        part := format('evidence_steps_%s', lo);
        BEGIN
            EXECUTE format('CREATE TABLE %I.%I (LIKE %I.evidence INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', ns, part, ns);
            EXECUTE format('ALTER TABLE %I.evidence ATTACH PARTITION %I.%I FOR VALUES FROM (%s) TO (%s)',
                           ns, ns, part, lo, hi);
            -- A statement trigger on the parent does not see a TRUNCATE of a partition.
            EXECUTE format('CREATE TRIGGER evidence_no_truncate BEFORE TRUNCATE ON %I.%I '
                           'FOR EACH STATEMENT EXECUTE FUNCTION %I.evq_append_only()', ns, part, ns);
        EXCEPTION WHEN lock_not_available THEN
            RETURN made;
        END;
        made := made + 1;
        top := hi;
    END LOOP;
    RETURN made;
END
$$
""",
        f"""
CREATE FUNCTION evq_evidence_sealed() RETURNS trigger
LANGUAGE plpgsql SET search_path = {path} AS $$
BEGIN
    RAISE EXCEPTION 'evq: evidence of step % refused: evq prune is removing the history of its range (%)',
        NEW.step_id, TG_TABLE_NAME
        USING ERRCODE = 'object_in_use',
              HINT = 'the step was closed before the prune cutoff; try again when evq prune has finished';
END
$$
""",
        f"""
CREATE FUNCTION evq_evidence_overflow() RETURNS trigger
LANGUAGE plpgsql SET search_path = {path} AS $$
BEGIN
    -- Only a step that was there when its range went: once the batches have taken that
    -- range's steps its ids are free, and a sequence reset (a restore, a logical copy)
    -- hands one to a new step, which lost nothing. Refusing its evidence would refuse
    -- its every claim (and fail each claim batch it falls in).
    IF EXISTS (SELECT 1 FROM prune_log l
               WHERE l.evidence_partition IS NOT NULL AND NEW.step_id BETWEEN l.first_step_id AND l.last_step_id
                 AND NOT EXISTS (SELECT 1 FROM email_steps s
                                 WHERE s.id = NEW.step_id AND s.created_at > l.created_at)) THEN
        RAISE EXCEPTION 'evq: evidence of step % refused: evq prune removed the history of its range', NEW.step_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'the step was closed before a prune cutoff and its evidence is gone';
    END IF;
    RETURN NEW;
END
$$
""",
        # Seek the oldest partition past p_after that retention may drop, and seal it. A
        # partition a run left sealed (stopped between seal and drop) comes first.
        f"""
CREATE FUNCTION evq_evidence_seal(p_cutoff timestamptz, p_after bigint)
RETURNS TABLE (partition_name text, range_lo bigint, range_hi bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} SET enable_seqscan = off AS $$
DECLARE
    p record;
    later record;
    recent boolean;
    -- The function's search path starts at pg_catalog: name evidence's schema outright.
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    {_CUTOFF_CHECK}
    FOR p IN SELECT * FROM evq_evidence_partitions() x WHERE x.lo > coalesce(p_after, -1) ORDER BY x.lo LOOP
        IF p.sealed THEN
            RETURN QUERY SELECT p.name, p.lo, p.hi;
            RETURN;
        END IF;
        -- Every id of the range was handed out before the cutoff: the first step above it was
        -- created before the cutoff. Otherwise neither this partition nor a later one may go.
        SELECT s.id, s.created_at INTO later FROM email_steps s WHERE s.id >= p.hi ORDER BY s.id LIMIT 1;
        EXIT WHEN later.id IS NULL OR later.created_at >= p_cutoff;
        -- No step of the range open (each read through its state's partial index), and no
        -- failure notice of one that may not go yet.
        CONTINUE WHEN EXISTS (SELECT 1 FROM email_steps s
                              WHERE s.status IN ('held', 'pending', 'retryable', 'unknown')
                                AND s.id >= p.lo AND s.id < p.hi);
        CONTINUE WHEN EXISTS (SELECT 1 FROM email_steps s
                              WHERE s.status = 'in_flight' AND s.id >= p.lo AND s.id < p.hi);
        CONTINUE WHEN EXISTS (SELECT 1 FROM email_steps n
                              WHERE n.notice_of >= p.lo AND n.notice_of < p.hi AND NOT {_closed_before("n")});
        -- Nothing written there since the cutoff (a step closed late, a late delivery event):
        -- through the partition's BRIN index, only the block ranges written since are read.
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I e WHERE e.created_at >= $1)', ns, p.name)
            INTO recent USING p_cutoff;
        CONTINUE WHEN recent;
        BEGIN
            PERFORM set_config('lock_timeout', '2s', true);
            EXECUTE format('CREATE TRIGGER evidence_sealed BEFORE INSERT ON %I.%I '
                           'FOR EACH ROW EXECUTE FUNCTION %I.evq_evidence_sealed()', ns, p.name, ns);
        EXCEPTION WHEN lock_not_available THEN
            CONTINUE;
        END;
        RETURN QUERY SELECT p.name, p.lo, p.hi;
        RETURN;
    END LOOP;
END
$$
""",
        f"""
CREATE FUNCTION evq_evidence_unseal(p_partition text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} AS $$
DECLARE
    -- The function's search path starts at pg_catalog: name evidence's schema outright.
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM evq_evidence_partitions() x WHERE x.name = p_partition AND x.sealed) THEN
        RETURN false;
    END IF;
    -- The give-back after a drop that timed out behind a reader: the same reader holds the
    -- partition, and an unseal queued for its lock would hold every later reader of it (and
    -- the prune) until that reader ends. Left sealed instead: the next evq prune takes it first.
    PERFORM set_config('lock_timeout', '2s', true);
    BEGIN
        EXECUTE format('DROP TRIGGER evidence_sealed ON %I.%I', ns, p_partition);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END
$$
""",
        # Drop a sealed partition whose every step is closed before the cutoff (false, and
        # unsealed, when one is not), logging it in prune_log; its steps and decisions are
        # left for evq_prune_batch, which finds them with no evidence to delete.
        f"""
CREATE FUNCTION evq_evidence_drop(p_partition text, p_cutoff timestamptz, p_actor text, p_run uuid, p_batch integer)
RETURNS TABLE (dropped boolean, rows_dropped bigint, range_lo bigint, range_hi bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {path} SET enable_seqscan = off AS $$
DECLARE
    p record;
    n bigint;
    -- The function's search path starts at pg_catalog: name evidence's schema outright.
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    {_CUTOFF_CHECK}
    SELECT * INTO p FROM evq_evidence_partitions() x WHERE x.name = p_partition;
    IF NOT FOUND OR NOT p.sealed THEN
        RAISE EXCEPTION 'evq: % is not a sealed evidence partition', p_partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Sealed, the range cannot change under these reads: every change of a step writes
    -- its evidence, and the seal refuses it.
    IF EXISTS (SELECT 1 FROM email_steps s
               WHERE s.id >= p.lo AND s.id < p.hi AND NOT {_closed_before("s")})
       OR EXISTS (SELECT 1 FROM email_steps n
                  WHERE n.notice_of >= p.lo AND n.notice_of < p.hi AND NOT {_closed_before("n")}) THEN
        EXECUTE format('DROP TRIGGER evidence_sealed ON %I.%I', ns, p.name);
        RETURN QUERY SELECT false, 0::bigint, p.lo, p.hi;
        RETURN;
    END IF;
    EXECUTE format('SELECT count(*) FROM %I.%I', ns, p.name) INTO n;
    -- The drop locks evidence itself for a moment: never wait long behind a slow reader.
    PERFORM set_config('lock_timeout', '5s', true);
    EXECUTE format('DROP TABLE %I.%I', ns, p.name);
    INSERT INTO prune_log (run, batch, actor, cutoff, steps, evidence, decisions, first_step_id, last_step_id,
                           evidence_partition)
    VALUES (p_run, p_batch, p_actor, p_cutoff, 0, n, 0, p.lo, p.hi - 1, p.name);
    RETURN QUERY SELECT true, n, p.lo, p.hi;
END
$$
""",
    ]


DEFINERS = (
    "evq_evidence_partitions_ahead(bigint)",
    "evq_evidence_seal(timestamptz, bigint)",
    "evq_evidence_unseal(text)",
    "evq_evidence_drop(text, timestamptz, text, uuid, integer)",
)

_LOOP = "c.relkind IN ('r', 'p', 'v', 'm', 'S')"
_LOOP_0022 = "c.relkind IN ('r', 'p', 'v', 'm', 'S') AND NOT c.relispartition"
_RETURN = "    RETURN done;"
_GRANTS = "".join(
    f"    EXECUTE format('GRANT EXECUTE ON FUNCTION %I.{signature} TO %I', schema_name, p_role);\n"
    for signature in DEFINERS
)
_GRANTS = "    -- Evidence partitions (0022): created ahead by the worker, dropped by evq prune.\n" + _GRANTS


def _grant_function() -> str:
    return (
        op.get_bind()
        .execute(sa.text("SELECT pg_get_functiondef('evq_grant_runtime(name)'::regprocedure)"))
        .scalar_one()
    )


def _scalar(sql: str) -> object:
    return op.get_bind().execute(sa.text(sql)).scalar_one()


def upgrade() -> None:
    bind = op.get_bind()
    schema = _scalar("SELECT current_schema()")
    path = f"pg_catalog, {_quoted(str(schema))}, pg_temp"
    checks = bind.execute(
        sa.text(
            "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint "
            "WHERE conrelid = 'evidence'::regclass AND contype = 'c' ORDER BY conname"
        )
    ).all()
    triggers = bind.execute(
        sa.text(
            "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgrelid = 'evidence'::regclass AND NOT tgisinternal ORDER BY tgname"
        )
    ).scalars()
    triggers = list(triggers)
    # The old table keeps its rows until they are copied; its sequence passes to the new one.
    op.execute("ALTER SEQUENCE evidence_id_seq OWNED BY NONE")
    op.execute("ALTER TABLE evidence RENAME TO evidence_0021")
    op.execute("ALTER TABLE evidence_0021 DROP CONSTRAINT pk_evidence")
    for index in ("ix_evidence_created_at_brin", "ix_evidence_step_id_id", "uq_evidence_answer_per_lease"):
        op.execute(f"DROP INDEX {index}")
    op.execute(PARENT)
    for name, definition in checks:
        op.execute(f"ALTER TABLE evidence ADD CONSTRAINT {_quoted(name)} {definition}")
    for statement in INDEXES:
        op.execute(statement)
    op.execute("ALTER SEQUENCE evidence_id_seq OWNED BY evidence.id")
    op.add_column("prune_log", sa.Column("evidence_partition", sa.Text(), nullable=True))
    op.execute("ALTER TABLE prune_log ALTER COLUMN evidence TYPE bigint")
    op.execute(APPEND_ONLY_0022)
    for statement in _functions(path):
        op.execute(statement)
    for signature in DEFINERS:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
    op.execute("CREATE TABLE evidence_overflow PARTITION OF evidence DEFAULT")
    op.execute(
        "CREATE TRIGGER evidence_no_truncate BEFORE TRUNCATE ON evidence_overflow "
        "FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only()"
    )
    op.execute(
        "CREATE TRIGGER evidence_overflow_guard BEFORE INSERT ON evidence_overflow "
        "FOR EACH ROW EXECUTE FUNCTION evq_evidence_overflow()"
    )
    op.execute(f"SELECT evq_evidence_partitions_ahead({STEPS})")
    # The rows, then the triggers: a copied row is not a new one (no key event again).
    op.execute("INSERT INTO evidence SELECT * FROM evidence_0021")
    op.execute("DROP TABLE evidence_0021")
    for definition in triggers:
        op.execute(definition)
    definition = _grant_function()
    if _LOOP_0022 not in definition:
        if _LOOP not in definition or _RETURN not in definition:
            raise RuntimeError("evq_grant_runtime does not read as 0009_runtime_role left it")
        op.execute(definition.replace(_LOOP, _LOOP_0022, 1).replace(_RETURN, _GRANTS + _RETURN, 1))


def downgrade() -> None:
    bind = op.get_bind()
    op.execute(_grant_function().replace(_GRANTS, "", 1).replace(_LOOP_0022, _LOOP, 1))
    checks = bind.execute(
        sa.text(
            "SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint "
            "WHERE conrelid = 'evidence'::regclass AND contype = 'c' ORDER BY conname"
        )
    ).all()
    triggers = list(
        bind.execute(
            sa.text(
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger "
                "WHERE tgrelid = 'evidence'::regclass AND NOT tgisinternal "
                "ORDER BY tgname"
            )
        ).scalars()
    )
    op.execute("ALTER SEQUENCE evidence_id_seq OWNED BY NONE")
    op.execute("ALTER TABLE evidence RENAME TO evidence_0022")
    op.execute(
        """
        CREATE TABLE evidence (
            id bigint NOT NULL DEFAULT nextval('evidence_id_seq'::regclass),
            step_id bigint NOT NULL, run_id text NOT NULL, attempt integer, kind text NOT NULL, actor text NOT NULL,
            from_status text, to_status text, outcome text, reason text, provider_message_id text,
            lease_token uuid, latency_ms double precision, detail jsonb NOT NULL DEFAULT '{}'::jsonb,
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("INSERT INTO evidence SELECT * FROM evidence_0022")
    op.execute("DROP TABLE evidence_0022")
    op.execute("ALTER TABLE evidence ADD CONSTRAINT pk_evidence PRIMARY KEY (id)")
    op.execute(
        "ALTER TABLE evidence ADD CONSTRAINT fk_evidence_step_id_email_steps "
        "FOREIGN KEY (step_id) REFERENCES email_steps (id)"
    )
    for name, definition in checks:
        op.execute(f"ALTER TABLE evidence ADD CONSTRAINT {_quoted(name)} {definition}")
    op.execute("CREATE INDEX ix_evidence_step_id_id ON evidence (step_id, id)")
    op.execute("CREATE INDEX ix_evidence_created_at_brin ON evidence USING brin (created_at) WITH (autosummarize = on)")
    op.execute(
        "CREATE UNIQUE INDEX uq_evidence_answer_per_lease ON evidence (lease_token) "
        "WHERE kind IN ('provider_response', 'late_response')"
    )
    op.execute("ALTER SEQUENCE evidence_id_seq OWNED BY evidence.id")
    for definition in triggers:
        op.execute(definition)
    for signature in DEFINERS:
        op.execute(f"DROP FUNCTION IF EXISTS {signature}")
    for name in ("evq_evidence_sealed()", "evq_evidence_overflow()", "evq_evidence_partitions()"):
        op.execute(f"DROP FUNCTION IF EXISTS {name}")
    op.execute(APPEND_ONLY_0009)
    op.execute("ALTER TABLE prune_log ALTER COLUMN evidence TYPE integer")
    op.drop_column("prune_log", "evidence_partition")
