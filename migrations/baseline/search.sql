-- The search box's function (docs/design.md, "Search"), made before the tables: the GIN index
-- ix_email_steps_recipient_keys (tables.sql) is built on it.
--
-- Every recipient of a request (to, cc, bcc) as the search box finds it: the address
-- lower-cased, and its domain as '@domain'. IMMUTABLE, with pg_catalog names only, so a restore
-- with an empty search_path builds the same index. PL/pgSQL rather than SQL: a SQL function
-- with a FROM and an aggregate is not inlined, and each statement that evaluated it (every
-- insert) planned its body again, about 80 us of the server's time; PL/pgSQL keeps the plan
-- for the session.
CREATE FUNCTION evq_recipient_keys(payload jsonb) RETURNS text[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE STRICT AS $$
BEGIN
    RETURN (
        SELECT coalesce(pg_catalog.array_agg(DISTINCT k), '{}'::text[])
        FROM (
            SELECT pg_catalog.lower(r.value OPERATOR(pg_catalog.->>) 'email') AS e
            FROM pg_catalog.jsonb_array_elements(
                pg_catalog.jsonb_build_array()
                OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'to', '[]'::jsonb)
                OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'cc', '[]'::jsonb)
                OPERATOR(pg_catalog.||) coalesce(payload OPERATOR(pg_catalog.->) 'bcc', '[]'::jsonb)
            ) AS r
            WHERE pg_catalog.jsonb_typeof(r.value) = 'object'
        ) AS a
        CROSS JOIN LATERAL (VALUES (a.e), ('@' OPERATOR(pg_catalog.||) pg_catalog.split_part(a.e, '@', 2))) AS x(k)
        WHERE a.e IS NOT NULL AND a.e OPERATOR(pg_catalog.<>) ''
    );
END
$$;
