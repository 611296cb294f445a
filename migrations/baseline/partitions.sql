-- Evidence partitioned by its step's id, so retention drops whole partitions (docs/design.md,
-- "Evidence partitions"). At 100 million sends a day evq writes about 300 million evidence rows
-- a day; deleting them a row at a time, each through the append-only trigger, cannot keep up.
--
-- - A step's evidence all lands in one partition, the one holding its id, so dropping a
--   partition removes whole histories, never part of one. Step ids come from one sequence in
--   enqueue order, so a partition is also a span of time.
-- - evidence_steps_<lo> holds the evidence of steps lo to hi - 1. evq_evidence_partitions_ahead
--   makes the next ones until four lie beyond the last step id handed out; the worker calls it
--   every minute, evq prune and this baseline once.
-- - evidence_overflow (the DEFAULT partition) takes evidence no partition covers, so a write is
--   never refused because maintenance fell behind; a partition made later starts above what it
--   holds. Its trigger refuses evidence for a range retention dropped (prune_log names it):
--   that step's history is gone, and a new row would be the only one left.
-- - Retention (worker/pruner.py) first seals a candidate partition (evq_evidence_seal: no step
--   of its range open, no notice of one open, nothing written there since the cutoff; then a
--   trigger refusing every insert into it), then evq_evidence_drop checks every step of the
--   range is closed before the cutoff and drops it, logging it in prune_log. Sealed, the range
--   cannot change under the check: every change of a step writes its evidence, and the seal
--   refuses it. The steps and decisions follow by evq_prune_batch, with no evidence to delete.
-- - The runtime role gets nothing on a partition (it reads and writes through evidence) and
--   EXECUTE on the definer functions below (roles.sql).
-- The functions name evidence's schema outright (ns) in what they EXECUTE: their search path
-- starts at pg_catalog.

-- Every partition but the overflow, by range, and whether retention has sealed it.
CREATE FUNCTION evq_evidence_partitions()
RETURNS TABLE (name text, lo bigint, hi bigint, sealed boolean)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT c.relname::text, m.b[1]::bigint, m.b[2]::bigint,
           EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = c.oid AND t.tgname = 'evidence_sealed')
    FROM pg_inherits i
    JOIN pg_class c ON c.oid = i.inhrelid
    CROSS JOIN LATERAL (
        SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid), 'FROM \(''?(-?\d+)''?\) TO \(''?(-?\d+)''?\)') AS b
    ) m
    WHERE i.inhparent = 'evidence'::regclass AND m.b IS NOT NULL
    ORDER BY 2
$$;

-- p_steps ids a partition (EVQ_EVIDENCE_PARTITION_STEPS), at most a billion: one partition
-- covering every future step would never be dropped.
CREATE FUNCTION evq_evidence_partitions_ahead(p_steps bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    last_id bigint := coalesce(pg_sequence_last_value(pg_get_serial_sequence('email_steps', 'id')::regclass), 0);
    top bigint := (SELECT max(p.hi) FROM evq_evidence_partitions() p);
    lo bigint;
    hi bigint;
    part text;
    made integer := 0;
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    IF p_steps IS NULL OR p_steps < 1 OR p_steps > 1000000000 THEN
        RAISE EXCEPTION 'evq: an evidence partition holds from 1 to 1000000000 step ids, not %', p_steps
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
$$;

-- The seal: a sealed partition takes no evidence while retention decides whether it may go.
CREATE FUNCTION evq_evidence_sealed() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    RAISE EXCEPTION 'evq: evidence of step % refused: evq prune is removing the history of its range (%)',
        NEW.step_id, TG_TABLE_NAME
        USING ERRCODE = 'object_in_use',
              HINT = 'the step was closed before the prune cutoff; try again when evq prune has finished';
END
$$;

-- The overflow's guard, read through ix_prune_log_dropped_ranges (a probe of a few entries,
-- however many prune batches prune_log holds).
CREATE FUNCTION evq_evidence_overflow() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
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
$$;

-- Seek the oldest partition past p_after that retention may drop, and seal it. A partition a
-- run left sealed (stopped between seal and drop) comes first. The seal checks that nothing was
-- written there since the cutoff before its trigger waits for the partition's writers, so a late
-- row whose writer had not committed may be sealed in: evq_evidence_drop counts again under its
-- lock. Each read must see what committed before it: under REPEATABLE READ or SERIALIZABLE
-- (default_transaction_isolation set on the database or the role) the whole call would read one
-- snapshot taken before it waited, so any other isolation level is refused.
CREATE FUNCTION evq_evidence_seal(p_cutoff timestamptz, p_after bigint)
RETURNS TABLE (partition_name text, range_lo bigint, range_hi bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET enable_seqscan = off AS $$
DECLARE
    p record;
    later record;
    recent boolean;
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    IF p_cutoff IS NULL OR p_cutoff > now() THEN
        RAISE EXCEPTION 'evq: prune cutoff % is later than the database''s clock (%)', p_cutoff, now()
            USING ERRCODE = 'invalid_parameter_value', HINT = 'compute the cutoff as now() - interval in the database';
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'evq: evidence partitions are sealed and dropped only under READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'run it in a READ COMMITTED transaction (check default_transaction_isolation)';
    END IF;
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
        -- A step under an attempt is pending or retryable there, and in the queue.
        CONTINUE WHEN EXISTS (SELECT 1 FROM step_queue q WHERE q.id >= p.lo AND q.id < p.hi);
        CONTINUE WHEN EXISTS (SELECT 1 FROM email_steps n
                              WHERE n.notice_of >= p.lo AND n.notice_of < p.hi
                                AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff
                                         AND n.closed_at < p_cutoff));
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
$$;

-- The give-back after a drop that timed out behind a reader, or of a partition that may not go.
-- A partition found unsealed is not an error.
CREATE FUNCTION evq_evidence_unseal(p_partition text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM evq_evidence_partitions() x WHERE x.name = p_partition AND x.sealed) THEN
        RETURN false;
    END IF;
    -- The same reader that made the drop time out holds the partition, and an unseal queued for
    -- its lock would hold every later reader of it (and the prune) until that reader ends. Left
    -- sealed instead: the next evq prune takes it first.
    PERFORM set_config('lock_timeout', '2s', true);
    BEGIN
        EXECUTE format('DROP TRIGGER IF EXISTS evidence_sealed ON %I.%I', ns, p_partition);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END
$$;

-- Drop a sealed partition whose every step is closed before the cutoff (false, and unsealed,
-- when one is not), logging it in prune_log; its steps and decisions are left for
-- evq_prune_batch, which finds them with no evidence to delete. READ COMMITTED only, as the seal.
CREATE FUNCTION evq_evidence_drop(p_partition text, p_cutoff timestamptz, p_actor text, p_run uuid, p_batch integer)
RETURNS TABLE (dropped boolean, rows_dropped bigint, range_lo bigint, range_hi bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT SET enable_seqscan = off AS $$
DECLARE
    p record;
    n bigint;
    newest timestamptz;
    ns name := (SELECT c.relnamespace::regnamespace::name FROM pg_class c WHERE c.oid = 'evidence'::regclass);
BEGIN
    IF p_cutoff IS NULL OR p_cutoff > now() THEN
        RAISE EXCEPTION 'evq: prune cutoff % is later than the database''s clock (%)', p_cutoff, now()
            USING ERRCODE = 'invalid_parameter_value', HINT = 'compute the cutoff as now() - interval in the database';
    END IF;
    IF current_setting('transaction_isolation') NOT IN ('read committed', 'read uncommitted') THEN
        RAISE EXCEPTION 'evq: evidence partitions are sealed and dropped only under READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'invalid_transaction_state',
                  HINT = 'run it in a READ COMMITTED transaction (check default_transaction_isolation)';
    END IF;
    -- An evidence partition's name (evidence_steps_<lo>, as the keeper names them). One that
    -- no longer exists was dropped by another evq prune: "not dropped" below, not an error.
    IF p_partition IS NULL OR p_partition !~ '^evidence_steps_[0-9]+$'
       OR (to_regclass(format('%I.%I', ns, p_partition)) IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                           WHERE i.inhparent = 'evidence'::regclass AND c.relname = p_partition)) THEN
        RAISE EXCEPTION 'evq: % is not an evidence partition', p_partition
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The partition's lock first, in a statement of its own: a statement's snapshot is taken
    -- before it waits for a lock, so reading the seal in the statement that first locked the
    -- partition could miss a give-back committed while it waited. Read after the lock, the seal
    -- is seen as every give-back that got in before left it, and none can come after (removing
    -- the trigger needs ACCESS EXCLUSIVE) until this transaction ends. SHARE UPDATE EXCLUSIVE
    -- lets readers and writers by and makes a second drop wait for this one: two drops holding
    -- a shared lock each would deadlock on DROP TABLE behind a reader.
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
    -- Sealed, the range cannot change under these reads: every change of a step writes
    -- its evidence, and the seal refuses it.
    IF EXISTS (SELECT 1 FROM email_steps s
               WHERE s.id >= p.lo AND s.id < p.hi
                 AND NOT (s.status IN ('accepted', 'rejected') AND s.created_at < p_cutoff AND s.closed_at < p_cutoff))
       OR EXISTS (SELECT 1 FROM email_steps n
                  WHERE n.notice_of >= p.lo AND n.notice_of < p.hi
                    AND NOT (n.status IN ('accepted', 'rejected') AND n.created_at < p_cutoff
                             AND n.closed_at < p_cutoff)) THEN
        EXECUTE format('DROP TRIGGER IF EXISTS evidence_sealed ON %I.%I', ns, p.name);
        RETURN QUERY SELECT false, 0::bigint, p.lo, p.hi;
        RETURN;
    END IF;
    -- Counted under the lock, with its newest row's time: a late row whose writer had not
    -- committed when the seal looked for recent rows (the seal's trigger then waited for it)
    -- is in the partition. It gives the partition back, as an open step does.
    EXECUTE format('SELECT count(*), max(e.created_at) FROM %I.%I e', ns, p.name) INTO n, newest;
    IF newest >= p_cutoff THEN
        EXECUTE format('DROP TRIGGER IF EXISTS evidence_sealed ON %I.%I', ns, p.name);
        RETURN QUERY SELECT false, 0::bigint, p.lo, p.hi;
        RETURN;
    END IF;
    -- The drop locks evidence itself for a moment: never wait long behind a slow reader.
    PERFORM set_config('lock_timeout', '5s', true);
    EXECUTE format('DROP TABLE %I.%I', ns, p.name);
    INSERT INTO prune_log (run, batch, actor, cutoff, steps, evidence, decisions, first_step_id, last_step_id,
                           evidence_partition)
    VALUES (p_run, p_batch, p_actor, p_cutoff, 0, n, 0, p.lo, p.hi - 1, p.name);
    RETURN QUERY SELECT true, n, p.lo, p.hi;
END
$$;

REVOKE ALL ON FUNCTION evq_evidence_partitions_ahead(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION evq_evidence_seal(timestamptz, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION evq_evidence_unseal(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION evq_evidence_drop(text, timestamptz, text, uuid, integer) FROM PUBLIC;

CREATE TABLE evidence_overflow PARTITION OF evidence DEFAULT;
CREATE TRIGGER evidence_no_truncate BEFORE TRUNCATE ON evidence_overflow
    FOR EACH STATEMENT EXECUTE FUNCTION evq_append_only();
CREATE TRIGGER evidence_overflow_guard BEFORE INSERT ON evidence_overflow
    FOR EACH ROW EXECUTE FUNCTION evq_evidence_overflow();

-- The first partitions, of the default size (1,000,000 step ids; EVQ_EVIDENCE_PARTITION_STEPS
-- sizes the ones the worker makes later).
SELECT evq_evidence_partitions_ahead(1000000);
