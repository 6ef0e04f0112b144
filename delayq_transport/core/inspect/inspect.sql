-- Inspection: bounded listings, cancel and reschedule by hand, search, health, whole-table scans.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- scan_bounds --
-- Id range of the whole table and the database clock, so queue_dataframe can split its read.
SELECT min("id") AS lo, max("id") AS hi, {now} AS now FROM {table}

-- scan_page_tasks --
-- One page of rows with lo <= id < hi, in id order, without the payload: only the Celery task
-- name, cut out of the stored message by a byte search for `"task": "` (the first such key of
-- a kombu message is headers.task: the body before it is base64), so a reader neither
-- transfers nor parses ~1 KB per row.
SELECT t."id", t."pKey", t."pKind",
       CASE WHEN p.at > 0 AND q.len > 0
            THEN convert_from(substring(t."payload" FROM p.at + 9 FOR q.len - 1), 'UTF8') END AS task,
       t."scheduledAt", t."scheduledAtInitially", t."createdAt",
       t."lockUuid" IS NOT NULL AND t."scheduledAt" > n.now AS in_flight,
       t."scheduledAt" > t."scheduledAtInitially"
           AND (t."lockUuid" IS NULL OR t."scheduledAt" <= n.now) AS redelivered
FROM {table} AS t
CROSS JOIN LATERAL (SELECT position('\x227461736b223a2022'::bytea IN t."payload") AS at) AS p
CROSS JOIN LATERAL (SELECT position('\x22'::bytea IN substring(t."payload" FROM p.at + 9)) AS len) AS q,
     (SELECT {now} AS now) AS n
WHERE t."id" >= %(lo)s AND t."id" < %(hi)s
ORDER BY t."id"
LIMIT %(limit)s

-- health_blockers --
-- What holds back the xmin horizon (rows VACUUM may not remove yet: every lease UPDATE and ack
-- DELETE leaves one at the low end of the poll's index), oldest first: client sessions with a
-- snapshot or transaction id (or idle in transaction), standbys with hot_standby_feedback,
-- replication slots, prepared transactions. VACUUM of a table ignores sessions and prepared
-- transactions of *other* databases, so only this database's are listed; standbys and physical
-- slots hold every database. A slot's catalog_xmin holds back catalogs only (shown, not aged).
-- Other roles' sessions are only visible with pg_monitor. Sessions younger than `min_age_s`
-- (every running statement has a snapshot) are left out.
SELECT * FROM (
    SELECT 'session' AS source, a.pid, a.usename::text AS role_name,
           a.application_name AS application, a.datname::text AS database, a.state,
           extract(epoch FROM now() - a.xact_start)::float8 AS age_s,
           age(COALESCE(a.backend_xmin, a.backend_xid))::bigint AS xmin_age_xids,
           left(a.query, 200) AS detail
    FROM pg_stat_activity AS a
    WHERE a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'
      AND a.datname = current_database()
      AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL
           OR a.state LIKE 'idle in transaction%%')
      AND a.xact_start < now() - make_interval(secs => %(min_age_s)s)
    UNION ALL
    SELECT 'standby', r.pid, r.usename::text, r.application_name, NULL, r.state, NULL,
           age(r.backend_xmin)::bigint, host(r.client_addr)
    FROM pg_stat_replication AS r WHERE r.backend_xmin IS NOT NULL
    UNION ALL
    SELECT 'replication_slot', s.active_pid, NULL, s.slot_name::text, s.database::text,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, NULL,
           age(s.xmin)::bigint,
           'xmin ' || COALESCE(s.xmin::text, '-') || ', catalog_xmin ' || COALESCE(s.catalog_xmin::text, '-')
    FROM pg_replication_slots AS s
    WHERE (s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL)
      AND (s.database IS NULL OR s.database = current_database())
    UNION ALL
    SELECT 'prepared_transaction', NULL, p.owner::text, p.gid, p.database::text, 'prepared',
           extract(epoch FROM now() - p.prepared)::float8, age(p.transaction)::bigint, NULL
    FROM pg_prepared_xacts AS p WHERE p.database = current_database()
) AS b
ORDER BY b.xmin_age_xids DESC NULLS LAST, b.age_s DESC NULLS LAST
LIMIT %(limit)s

-- health_table --
-- The queue table from the catalogs and cumulative statistics (no table read): sizes, live and
-- dead tuples, time since the last (auto)vacuum/analyze, and the average row width pg_stats
-- measured and the table's fillfactor (for the bloat estimate; width NULL before the first
-- ANALYZE; migration 6 leaves half of each page free on purpose).
SELECT pg_relation_size(c.oid) AS table_bytes, pg_total_relation_size(c.oid) AS total_bytes,
       st.n_live_tup AS live_tuples, st.n_dead_tup AS dead_tuples,
       st.n_mod_since_analyze AS modified_since_analyze,
       extract(epoch FROM now() - GREATEST(st.last_vacuum, st.last_autovacuum))::float8 AS since_vacuum_s,
       extract(epoch FROM now() - GREATEST(st.last_analyze, st.last_autoanalyze))::float8 AS since_analyze_s,
       (SELECT sum(ps.avg_width) FROM pg_stats AS ps
        WHERE ps.schemaname = ns.nspname AND ps.tablename = c.relname AND NOT ps.inherited)::bigint AS row_width,
       current_setting('block_size')::int AS block_size,
       COALESCE((SELECT o.option_value FROM pg_options_to_table(c.reloptions) AS o
                 WHERE o.option_name = 'fillfactor')::int, 100) AS fillfactor
FROM pg_class AS c
JOIN pg_namespace AS ns ON ns.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables AS st ON st.relid = c.oid
WHERE c.oid = to_regclass({table_literal})

-- health_indexes --
-- Each index of the queue table: size, scans, and the average width of its key columns from
-- pg_stats (for the bloat estimate; NULL before the first ANALYZE).
SELECT ic.relname::text AS name, pg_relation_size(i.indexrelid) AS bytes, si.idx_scan AS scans,
       (SELECT sum(ps.avg_width) FROM pg_attribute AS a
        JOIN pg_stats AS ps ON ps.schemaname = ns.nspname AND ps.tablename = tc.relname
                           AND ps.attname = a.attname AND NOT ps.inherited
        WHERE a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey))::bigint AS key_width
FROM pg_index AS i
JOIN pg_class AS ic ON ic.oid = i.indexrelid
JOIN pg_class AS tc ON tc.oid = i.indrelid
JOIN pg_namespace AS ns ON ns.oid = tc.relnamespace
LEFT JOIN pg_stat_user_indexes AS si ON si.indexrelid = i.indexrelid
WHERE i.indrelid = to_regclass({table_literal})
ORDER BY ic.relname

-- Statements of core/inspect/inspector.py (`delayq tasks`, `delayq web`): listing, one task, cancel,
-- reschedule, overview and timeline. Every read is bounded (LIMIT inside each index scan), so a
-- page costs the same on 5M rows as on 5k; nothing counts the whole table.

-- inspect_kinds --
-- Every kind present in the table: a loose index scan (one index probe per kind), not a scan.
WITH RECURSIVE k AS (
    (SELECT "pKind" AS kind FROM {table} ORDER BY "pKind" LIMIT 1)
    UNION ALL
    SELECT (SELECT "pKind" FROM {table} WHERE "pKind" > k.kind ORDER BY "pKind" LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)
SELECT kind FROM k WHERE kind IS NOT NULL LIMIT %(limit)s

-- inspect_window --
-- The next `budget` rows after the keyset cursor (scheduledAt, id) over these kinds, in that
-- order: each kind contributes at most `budget` rows read from the (pKind, scheduledAt) index
-- (ties on scheduledAt ordered by id in an incremental sort), and the merged top `budget` are
-- exactly the global next `budget`. No new index: the hot path's indexes serve it.
-- Filters the index cannot answer (state, task name, text) are applied to this window by the
-- caller, so a filtered page is a bounded scan that says where it stopped.
WITH n AS (SELECT {now} AS now),
w AS (
    SELECT s.id, s.at
    FROM unnest(%(kinds)s::text[]) AS k(kind)
    CROSS JOIN LATERAL (
        SELECT "id", "scheduledAt" AS at FROM {table}
        WHERE "pKind" = k.kind AND "scheduledAt" >= %(after_at)s::bigint
          AND ("scheduledAt", "id") > (%(after_at)s::bigint, %(after_id)s::bigint)
          AND "scheduledAt" >= %(lo)s::bigint AND "scheduledAt" < %(hi)s::bigint
        ORDER BY "scheduledAt", "id"
        LIMIT %(budget)s
    ) AS s
    ORDER BY s.at, s.id
    LIMIT %(budget)s
)
SELECT t."id", t."pKey", t."pKind", CASE WHEN %(with_payload)s THEN t."payload" END,
       t."scheduledAt", t."scheduledAtInitially", t."lockUuid", t."createdAt", n.now
FROM w JOIN {table} AS t ON t."id" = w.id CROSS JOIN n
ORDER BY w.at, w.id

-- inspect_match_window --
-- What a bulk action collects from one kind: the next `budget` rows of an ETA range after the
-- keyset cursor (scheduledAt, id), with the ETA and creation time each has now (the action
-- later changes a row only if both are still the same). One walk of the (pKind, scheduledAt)
-- index and one heap fetch per row; inspect_window also joins each row back by id.
SELECT "id", "scheduledAt", "createdAt" FROM {table}
WHERE "pKind" = %(kind)s AND "scheduledAt" >= %(after_at)s::bigint
  AND ("scheduledAt", "id") > (%(after_at)s::bigint, %(after_id)s::bigint)
  AND "scheduledAt" >= %(lo)s::bigint AND "scheduledAt" < %(hi)s::bigint
ORDER BY "scheduledAt", "id"
LIMIT %(budget)s

-- inspect_held --
-- Rows a consumer acquired (lockUuid set), after the keyset cursor: found through the lockUuid
-- index, so listing what is in flight never walks the scheduled rows. Few by nature (workers'
-- prefetch); `budget` bounds them anyway.
SELECT t."id", t."pKey", t."pKind", NULL::bytea, t."scheduledAt", t."scheduledAtInitially",
       t."lockUuid", t."createdAt", n.now
FROM {table} AS t, (SELECT {now} AS now) AS n
WHERE t."lockUuid" IS NOT NULL AND t."pKind" = ANY(%(kinds)s::text[])
  AND (t."scheduledAt", t."id") > (%(after_at)s::bigint, %(after_id)s::bigint)
ORDER BY t."scheduledAt", t."id"
LIMIT %(budget)s

-- inspect_by_ids --
-- Full rows by primary key (a page's payloads, one task's page).
SELECT t."id", t."pKey", t."pKind", t."payload", t."scheduledAt", t."scheduledAtInitially",
       t."lockUuid", t."createdAt", n.now
FROM {table} AS t, (SELECT {now} AS now) AS n
WHERE t."id" = ANY(%(ids)s::bigint[])
ORDER BY t."scheduledAt", t."id"

-- inspect_by_key --
-- Rows of one key (a Celery task id) in any kind, through the unique index's leading column.
SELECT t."id", t."pKey", t."pKind", t."payload", t."scheduledAt", t."scheduledAtInitially",
       t."lockUuid", t."createdAt", n.now
FROM {table} AS t, (SELECT {now} AS now) AS n
WHERE t."pKey" = %(key)s
ORDER BY t."id"
LIMIT 20

-- inspect_by_keys --
-- Rows of these keys (task ids) in any kind: the watch list (is my task still queued?).
SELECT t."id", t."pKey", t."pKind", t."payload", t."scheduledAt", t."scheduledAtInitially",
       t."lockUuid", t."createdAt", n.now
FROM {table} AS t, (SELECT {now} AS now) AS n
WHERE t."pKey" = ANY(%(keys)s::text[])
ORDER BY t."scheduledAt", t."id"
LIMIT 1000

-- inspect_cancel --
-- Delete waiting rows by id. Rows a consumer holds (lockUuid set) are never deleted: the caller
-- reports them as in flight.
DELETE FROM {table} WHERE "id" = ANY(%(ids)s::bigint[]) AND "lockUuid" IS NULL
RETURNING "id"

-- inspect_cancel_unchanged --
-- inspect_cancel for the rows a filter matched (bulk actions): each row is deleted only if no
-- consumer holds it and it is still as it was when it matched (same ETA, not replaced), so a
-- row that moved out of the selection or was replaced since stays. Primary-key lookups.
DELETE FROM {table} AS t
USING unnest(%(ids)s::bigint[], %(ats)s::bigint[], %(created)s::bigint[]) AS v(id, at, created)
WHERE t."id" = v.id AND t."lockUuid" IS NULL
  AND t."scheduledAt" = v.at AND t."createdAt" = v.created
RETURNING t."id"

-- inspect_reschedule --
-- Move one waiting row (and give it the payload that carries the new ETA), only if no consumer
-- holds it and nobody replaced it since it was read (a retry republishing the same task id).
-- The update trigger wakes consumers, so a row moved to now runs at once.
UPDATE {table}
SET "scheduledAt" = %(at)s, "scheduledAtInitially" = %(at)s, "payload" = %(payload)s
WHERE "id" = %(id)s AND "lockUuid" IS NULL
  AND "createdAt" = %(expected_created)s AND "scheduledAtInitially" = %(expected_initially)s
RETURNING "id"

-- inspect_reschedule_many --
-- inspect_reschedule for a batch (bulk actions): each row moves with its own time and payload,
-- under the same conditions (not held, not replaced since it was read).
UPDATE {table} AS t
SET "scheduledAt" = v.at, "scheduledAtInitially" = v.at, "payload" = v.payload
FROM unnest(%(ids)s::bigint[], %(ats)s::bigint[], %(payloads)s::bytea[], %(created)s::bigint[],
            %(initially)s::bigint[]) AS v(id, at, payload, created, first_at)
WHERE t."id" = v.id AND t."lockUuid" IS NULL
  AND t."createdAt" = v.created AND t."scheduledAtInitially" = v.first_at
RETURNING t."id"

-- inspect_overview --
-- Per kind: bounded counts (each stops at `cap`; the caller shows "cap+"), the oldest due
-- row's lag and the next scheduled time, all from index range scans. In-flight rows are found
-- through the lockUuid index, never by walking the scheduled rows.
WITH n AS (SELECT {now} AS now),
flight AS (
    SELECT f."pKind" AS kind, count(*) AS n
    FROM (SELECT "pKind" FROM {table}, n
          WHERE "lockUuid" IS NOT NULL AND "scheduledAt" > n.now LIMIT %(cap)s) AS f
    GROUP BY f."pKind"
)
SELECT k.kind,
       (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE "pKind" = k.kind
                              AND "scheduledAt" <= n.now LIMIT %(cap)s) AS x) AS due,
       (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE "pKind" = k.kind
                              AND "scheduledAt" > n.now LIMIT %(cap)s) AS x) AS later,
       COALESCE((SELECT flight.n FROM flight WHERE flight.kind = k.kind), 0) AS in_flight,
       (SELECT count(*) FROM (SELECT "scheduledAt" > "scheduledAtInitially"
                                     AND ("lockUuid" IS NULL OR "scheduledAt" <= n.now) AS r
                              FROM {table} WHERE "pKind" = k.kind
                              ORDER BY "scheduledAt" LIMIT %(redelivered_cap)s) AS x
        WHERE x.r) AS redelivered,
       n.now - (SELECT min("scheduledAt") FROM {table}
                WHERE "pKind" = k.kind AND "scheduledAt" <= n.now) AS oldest_due_lag_ms,
       (SELECT min("scheduledAt") FROM {table}
        WHERE "pKind" = k.kind AND "scheduledAt" > n.now AND "lockUuid" IS NULL) AS next_due_at,
       n.now
FROM unnest(%(kinds)s::text[]) AS k(kind) CROSS JOIN n

-- inspect_timeline --
-- Rows due in each [lo, hi) bucket over these kinds, each count stopping at `cap` (the caller
-- estimates capped buckets from the column histogram).
SELECT b.i, (SELECT count(*) FROM (SELECT 1 FROM {table}
                                   WHERE "pKind" = ANY(%(kinds)s::text[])
                                     AND "scheduledAt" >= b.lo AND "scheduledAt" < b.hi
                                   LIMIT %(cap)s) AS x) AS n
FROM unnest(%(los)s::bigint[], %(his)s::bigint[]) WITH ORDINALITY AS b(lo, hi, i)
ORDER BY b.i

-- inspect_stats --
-- Planner statistics and activity counters of the table: estimated rows, the scheduledAt
-- histogram (estimates for buckets too full to count), inserts and deletes so far (rates).
SELECT c.reltuples::bigint AS rows_estimate,
       (SELECT s.histogram_bounds::text FROM pg_stats AS s
        WHERE s.schemaname = n.nspname AND s.tablename = c.relname
          AND s.attname = 'scheduledAt') AS histogram,
       COALESCE(a.n_tup_ins, 0) AS inserted, COALESCE(a.n_tup_del, 0) AS deleted,
       COALESCE(a.n_live_tup, 0) AS live_estimate, {now} AS now
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables AS a ON a.relid = c.oid
WHERE c.oid = to_regclass(quote_ident(%(table_name)s))

-- Statements of the opt-in argument search index (core/inspect/search.py, `delayq tasks search-index`).
-- Not created by default: the table keeps exactly its three indexes, and publishing pays
-- nothing for a search nobody uses. With it, a text search answers from a trigram index.

-- search_fn_create --
-- The searchable text of a payload: a kombu message's base64 body decoded (a Celery task's
-- args and kwargs as JSON), any other payload as it is; bytes outside ASCII as \ooo escapes.
-- IMMUTABLE and error-free on any bytes, so an index can be built on it.
CREATE OR REPLACE FUNCTION {search_fn}(p bytea) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $fn$
SELECT CASE WHEN b IS NOT NULL AND mod(length(b), 4) = 0
            THEN encode(decode(b, 'base64'), 'escape') ELSE encode(p, 'escape') END
FROM (SELECT substring(encode(p, 'escape') FROM '"body": "([A-Za-z0-9+/]*={{0,2}})"') AS b) AS s
$fn$

-- search_extension --
-- Trigram matching (a contrib extension shipped with PostgreSQL).
CREATE EXTENSION IF NOT EXISTS pg_trgm

-- search_index_create --
-- The opt-in GIN trigram index on the searchable text; CONCURRENTLY: publishing goes on.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {search_index} ON {table}
USING gin ({search_fn}("payload") gin_trgm_ops)

-- search_index_drop --
-- Remove the opt-in index (and its function): back to the three indexes of the design.
DROP INDEX CONCURRENTLY IF EXISTS {search_index}

-- search_fn_drop --
-- The index's function, once the index is gone.
DROP FUNCTION IF EXISTS {search_fn}(bytea)

-- search_index_valid --
-- Whether the opt-in index exists and is usable (a failed CONCURRENTLY build leaves it invalid).
SELECT i.indisvalid FROM pg_index AS i WHERE i.indexrelid = to_regclass({search_index_literal})

-- search_time_limit --
-- The index search's own statement_timeout (this transaction only): a text in most rows is
-- found faster by the scan.
SELECT set_config('statement_timeout', %(limit_ms)s, true)

-- search_indexed --
-- Rows whose searchable text contains `pattern` (ILIKE, answered by the trigram index), after
-- the keyset cursor, in (scheduledAt, id) order. A superset: the caller checks each row
-- exactly (the pattern is the longest plain piece of what was typed).
SELECT t."id", t."pKey", t."pKind", t."payload", t."scheduledAt", t."scheduledAtInitially",
       t."lockUuid", t."createdAt", n.now
FROM {table} AS t, (SELECT {now} AS now) AS n
WHERE t."pKind" = ANY(%(kinds)s::text[])
  AND t."scheduledAt" >= %(lo)s::bigint AND t."scheduledAt" < %(hi)s::bigint
  AND (t."scheduledAt", t."id") > (%(after_at)s::bigint, %(after_id)s::bigint)
  AND {search_fn}(t."payload") ILIKE %(pattern)s
ORDER BY t."scheduledAt", t."id"
LIMIT %(budget)s
