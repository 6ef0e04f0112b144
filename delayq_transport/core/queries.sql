-- Every statement delayq sends to PostgreSQL, one named block per operation of the data model
-- (docs/explanation/design.md). Blocks start with `-- name --`, then a one-line comment.
-- `{table}`, `{idx_*}`, `{notify_fn}` and friends are identifiers, validated and quoted by
-- delayq_transport.queries; `{now}` expands to the one clock expression below. Values are
-- always bound parameters (`%(name)s`).
--
-- {now}: `COALESCE(%(now)s::bigint, <database clock in epoch ms>)`. A queue built with an
-- injected clock passes `now`; every other queue passes NULL, so one queue never mixes clocks.

-- db_now --
-- The clock every queue uses unless a test injects its own.
SELECT {now} AS now

-- offer_insert --
-- Phase 1 of offer(): optimistic insert; 0 rows means the key exists. The stored scheduledAt
-- comes back so this process's low watermark can drop below it at once. The statement marks
-- itself with its statement_timestamp, so the insert trigger's WHEN skips it (migration 5): the
-- wake-up is this process' to send, at most one per short window (core/announce.py). The
-- publish that opens a window (`announce`) carries it in this statement: a NOTIFY of its row,
-- and of the rows (`pending`, "kind:ms") this process committed since the last one, delivered
-- at this commit, so a wake-up costs neither a round trip nor a transaction of its own. Only
-- that publish's commit takes PostgreSQL's notify lock (held from commit until the commit record
-- is written, so notifying commits queue behind one another and cannot share a WAL flush: issue
-- 27, 4 publishers, 7,520-7,870 inserts/s with no NOTIFY, 3,750-4,370 with one per commit).
WITH ins AS (
    INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    VALUES (%(key)s, %(kind)s, %(payload)b, COALESCE(%(scheduled_at)s::bigint, {now}),
            COALESCE(%(scheduled_at)s::bigint, {now}), {now})
    ON CONFLICT ("pKey", "pKind") DO NOTHING
    RETURNING "pKind", "scheduledAt"
)
SELECT ins."scheduledAt", set_config('delayq.notified_at', statement_timestamp()::text, true),
       CASE WHEN %(announce)s::boolean THEN (
           SELECT count(pg_notify({channel_literal}, p))
           FROM unnest(array_append(%(pending)s::text[],
                                    ins."pKind" || ':' || ins."scheduledAt")) AS p) END
FROM ins

-- offer_select_for_update --
-- Phase 2 of offer(): lock the existing row so the compare-and-swap below cannot lose an update.
SELECT "id", "pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "lockUuid", "createdAt"
FROM {table}
WHERE "pKey" = %(key)s AND "pKind" = %(kind)s
LIMIT 1
FOR UPDATE

-- offer_cas_update --
-- Phase 2 of offer(): replace the row only if nobody changed it since we read it.
-- Clearing lockUuid turns a pending ack of the replaced delivery into a no-op.
UPDATE {table}
SET "payload" = %(payload)s,
    "scheduledAt" = COALESCE(%(scheduled_at)s::bigint, {now}),
    "scheduledAtInitially" = COALESCE(%(scheduled_at)s::bigint, {now}),
    "lockUuid" = NULL,
    "createdAt" = {now}
WHERE "pKey" = %(key)s AND "pKind" = %(kind)s
  AND "scheduledAtInitially" = %(expected_initially)s AND "createdAt" = %(expected_created)s
RETURNING "scheduledAt"

-- offer_batch_insert --
-- offer_batch() and concurrent offers of one process (core/combine.py): one multi-row insert
-- from arrays (sent in binary: text-format arrays of bytea cost more to escape than the insert
-- itself); RETURNING names the keys that were created, every other key already existed (or
-- repeats within the batch). Rows closer to now than `min_lead_ms` are not inserted
-- (CronService: a late installer must not revive a fired tick). Skips the insert trigger as
-- offer_insert does, and carries this process' wake-up the same way when `announce`: every
-- distinct scheduledAt created per kind, the first `max_listed` one by one and a search
-- marker (chr(30) || kind || ':' || ms) at the first one left out, and the rows `pending`,
-- notified at this commit (core/announce.py).
WITH ins AS (
    INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    SELECT s.key, s.kind, s.payload, COALESCE(s.at, {now}), COALESCE(s.at, {now}), {now}
    FROM unnest(%(keys)b::text[], %(kinds)b::text[], %(payloads)b::bytea[], %(ats)b::bigint[])
         AS s(key, kind, payload, at)
    WHERE %(min_lead_ms)s::bigint IS NULL
       OR COALESCE(s.at, {now}) > {now} + %(min_lead_ms)s::bigint
    ON CONFLICT ("pKey", "pKind") DO NOTHING
    RETURNING "pKey", "pKind", "scheduledAt"
),
note AS (
    SELECT CASE WHEN %(announce)s::boolean THEN (
        SELECT count(pg_notify({channel_literal}, w.p))
        FROM (SELECT CASE WHEN d.n > %(max_listed)s THEN chr(30) ELSE '' END
                     || d.kind || ':' || d.at AS p
              FROM (SELECT u.kind, u.at, row_number() OVER (PARTITION BY u.kind ORDER BY u.at) AS n
                    FROM (SELECT DISTINCT "pKind" AS kind, "scheduledAt" AS at FROM ins) AS u) AS d
              WHERE d.n <= %(max_listed)s + 1
              UNION ALL SELECT unnest(%(pending)s::text[])) AS w) END AS n
)
SELECT ins."pKey", ins."pKind", ins."scheduledAt",
       set_config('delayq.notified_at', statement_timestamp()::text, true)
FROM ins CROSS JOIN note

-- try_poll_many --
-- Acquire up to `limit` due rows in one statement. Kinds are tried in the order given
-- (priority buckets); the outer LIMIT stops the lateral scan as soon as enough rows are locked.
-- The lease is the new scheduledAt; previous_at tells a redelivery from a first delivery.
-- A last row (id NULL) carries the earliest scheduledAt left over these kinds (leases included),
-- so a consumer learns when to wake next without a second round trip, and the statement's now.
-- `want_next` false skips that search: above now it walks every lease of the last
-- acquire_timeout, acked ones included, which a held snapshot keeps alive (the watermark then
-- asks only now and then and keeps what NOTIFYs announce in between).
-- `lows` (one per kind, NULL = from the bottom) is the consumer's low watermark: no live due row
-- is known below it, so the scan starts there, above the dead index entries that every acquire
-- and ack leave at the low end of (pKind, scheduledAt) and that a held snapshot keeps alive
-- (docs/explanation/scaling.md). A watermark above now (a clock stepped back) is ignored.
-- Both scans start at a row comparison on ("pKind", "scheduledAt") and order by both columns:
-- only that index can serve them, as an ordered scan that stops at LIMIT. The upper bound is
-- scalar (`"pKind" = k.kind AND "scheduledAt" <= n.now`): PostgreSQL 15 does not stop a scan at
-- a row comparison's upper bound decided by its second column, nor at a scalar one beside it,
-- so a poll that found fewer due rows than its LIMIT walked every later row of the kind (1M
-- countdowns: 3,930 pages, ~100 ms per short poll; now 99 pages, 0.3 ms). With
-- `"pKind" = k.kind` instead, a generic plan re-made after an ANALYZE that saw a few live rows
-- among tens of thousands of snapshot-held dead ones chose a bitmap scan of the pKey index on
-- its second column, every dead entry of the kind per poll (3 -> 15 ms, a 60-s stall of the
-- held-snapshot benchmark until the next ANALYZE); the consumer pool also runs with bitmap
-- and sort scans off (core/db.py): a sort is how any other index could serve the ORDER BY.
-- The update finds its rows by the ctids the locking scan returned (a TID scan, no index to
-- choose; the rows are locked, so the versions cannot move). By `id = ANY(array)` alone, the
-- same re-made plans took a full scan of the lock index on its second column (65-100 ms per
-- poll); before that, a join on `picked` became a sequential scan on larger tables.
WITH n AS (SELECT {now} AS now),
k AS (
    SELECT u.kind, u.ord,
           CASE WHEN u.low <= n.now THEN u.low ELSE -9223372036854775808 END AS low
    FROM unnest(%(kinds)s::text[], %(lows)s::bigint[]) WITH ORDINALITY AS u(kind, low, ord), n
),
picked AS (
    SELECT q.id, q.ctid, q."scheduledAt" AS previous_at, k.ord
    FROM k CROSS JOIN n
    CROSS JOIN LATERAL (
        SELECT "id", ctid, "scheduledAt"
        FROM {table}
        WHERE ("pKind", "scheduledAt") >= (k.kind, k.low)
          AND "pKind" = k.kind AND "scheduledAt" <= n.now
        ORDER BY "pKind", "scheduledAt"
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS q
    LIMIT %(limit)s
),
acquired AS (
    UPDATE {table} AS t
    SET "lockUuid" = %(lock)s, "scheduledAt" = {now} + %(lease_ms)s::bigint
    WHERE t.ctid = ANY(ARRAY(SELECT ctid FROM picked))
      AND t."id" = ANY(ARRAY(SELECT id FROM picked))
    RETURNING t."id", t."pKey", t."pKind", t."payload", t."scheduledAtInitially", t."createdAt"
)
SELECT a."id", a."pKey", a."pKind", a."payload", p.previous_at, a."scheduledAtInitially",
       a."createdAt", p.ord, NULL::bigint AS next_due, NULL::bigint AS polled_at
FROM acquired AS a JOIN picked AS p ON p.id = a."id"
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, CASE WHEN %(want_next)s THEN (
    SELECT min(x.at)
    FROM k
    CROSS JOIN LATERAL (
        SELECT "scheduledAt" AS at FROM {table}
        WHERE ("pKind", "scheduledAt") >= (k.kind, k.low)
          AND ("pKind", "scheduledAt") <= (k.kind, 9223372036854775807::bigint)
          AND "id" NOT IN (SELECT id FROM picked)
        ORDER BY "pKind", "scheduledAt" LIMIT 1
    ) AS x
) END, (SELECT now FROM n)

-- probe_below_watermark --
-- The low watermark's safety net, in a thread of its own (core/watermark.py): per kind, the
-- earliest due row from `start` (NULL: the bottom) to below the consumer's floor, if any (a
-- row some locker skipped and then released without a NOTIFY). It walks every dead index
-- entry in that range, which is why the poll never does. Rows locked by a poll in flight may
-- show up too: lowering is harmless. The scalar bounds stop the scan at the floor (see
-- try_poll_many): without them a probe that found nothing walked every later row of the kind.
SELECT k.kind, x.at
FROM unnest(%(kinds)s::text[], %(starts)s::bigint[], %(floors)s::bigint[])
     AS k(kind, start, floor)
CROSS JOIN LATERAL (
    SELECT "scheduledAt" AS at FROM {table}
    WHERE ("pKind", "scheduledAt") >= (k.kind, COALESCE(k.start, -9223372036854775808))
      AND "pKind" = k.kind AND "scheduledAt" <= LEAST(k.floor - 1, {now})
    ORDER BY "pKind", "scheduledAt" LIMIT 1
) AS x

-- ack --
-- Delete one delivery; a row re-acquired or replaced since then carries another lock and stays.
DELETE FROM {table} WHERE "id" = %(id)s AND "lockUuid" = %(lock)s

-- ack_many --
-- Delete many deliveries in one statement, each matched on its own (id, lock) pair.
-- The `= ANY` conditions bound the index scan whatever the estimates: the consumer pool's
-- generic plan, made while the table looked empty (analyzed after every row was acked), walked
-- the whole lock index inside a join on the pairs (662 ms per ack after 10 minutes under a held
-- snapshot). The pair is checked by position, not by a join: with the bounds in place the
-- planner put the pairs' function scan inside a nested loop, every row compared with every
-- pair (100 x 100 per call: 2.5x the cost of the whole ack). `ids` holds each id once
-- (`lock_set`: the distinct locks); DelayedQueue._by_pair sends a repeated id in a later call.
-- release and dead_letter alike.
DELETE FROM {table} AS t
WHERE t."id" = ANY(%(ids)b::bigint[]) AND t."lockUuid" = ANY(%(lock_set)b::text[])
  AND t."lockUuid" = (%(locks)b::text[])[array_position(%(ids)b::bigint[], t."id")]

-- ack_lock --
-- Delete every row acquired under one lock: the acknowledge of a whole poll.
DELETE FROM {table} WHERE "lockUuid" = %(lock)s

-- extend_lease --
-- Push the lease of rows a live consumer still holds, so they are not redelivered.
UPDATE {table} SET "scheduledAt" = {now} + %(lease_ms)s::bigint
WHERE "lockUuid" = ANY(%(locks)s::text[])

-- release --
-- Un-acquire deliveries in place (reject/requeue, closing channel): no copy is made. The row
-- becomes due after `delay_ms` and reads as a redelivery; where it went comes back (watermark).
UPDATE {table} AS t
SET "lockUuid" = NULL,
    "scheduledAt" = GREATEST({now} + %(delay_ms)s::bigint, t."scheduledAtInitially" + 1)
WHERE t."id" = ANY(%(ids)s::bigint[]) AND t."lockUuid" = ANY(%(lock_set)s::text[])
  AND t."lockUuid" = (%(locks)s::text[])[array_position(%(ids)s::bigint[], t."id")]
RETURNING t."pKind", t."scheduledAt"

-- get --
-- Read one row by key.
SELECT "id", "pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "lockUuid", "createdAt"
FROM {table}
WHERE "pKey" = %(key)s AND "pKind" = %(kind)s

-- delete --
-- Delete one row by key, whatever its state.
DELETE FROM {table} WHERE "pKey" = %(key)s AND "pKind" = %(kind)s

-- delete_waiting_by_keys --
-- Revoke scheduled tasks: delete the rows with these keys, in any kind, that no consumer holds,
-- through the table's revoke function (migration 13), so a role with no DELETE on the table
-- (a producer) may revoke what it names and nothing more.
SELECT "pKey", "pKind" FROM {revoke_fn}(%(keys)s::text[])

-- purge --
-- Drop every waiting row (due or scheduled) of these kinds; rows in flight stay.
DELETE FROM {table} WHERE "pKind" = ANY(%(kinds)s::text[]) AND "lockUuid" IS NULL

-- count_waiting --
-- Rows of these kinds that are not in flight, counted exactly: O(rows), kept for callers that
-- need the exact figure on small tables. kombu's queue size is `count_due` below.
SELECT count(*) AS n FROM {table} WHERE "pKind" = ANY(%(kinds)s::text[]) AND "lockUuid" IS NULL

-- count_plan_guard --
-- Run first (same transaction) by every capped count: the count must walk its index and stop at
-- the cap. Without statistics (a table Spark just bulk-loaded) the planner picked a bitmap scan
-- of the whole kind plus a sort: 4-25 s at 10M rows instead of ~0.1 s. SET LOCAL needs no privilege.
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off;
SET LOCAL jit = off

-- count_due --
-- kombu's queue size (message_count): due rows of these kinds, expired leases included (they
-- are delivered next), counted exactly up to `cap`. Far-future rows are not "in the queue",
-- like an ETA task Redis' transport has already handed to a worker.
SELECT count(*) AS n FROM (
    SELECT 1 FROM {table}
    WHERE "pKind" = ANY(%(kinds)s::text[]) AND "scheduledAt" <= {now}
    LIMIT %(cap)s
) AS due

-- next_due --
-- Earliest scheduledAt over these kinds, leases included (an expiring lease is a redelivery).
SELECT min(x.at) AS at
FROM unnest(%(kinds)s::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT "scheduledAt" AS at FROM {table} WHERE "pKind" = k.kind ORDER BY "scheduledAt" LIMIT 1
) AS x

-- status --
-- Exact per-kind counters for `delayq status --exact`: one pass over the whole table (seconds at
-- millions of rows). A row whose lease ran out counts as due and redelivered.
SELECT "pKind" AS kind,
       count(*) FILTER (WHERE "scheduledAt" <= n.now) AS due,
       count(*) FILTER (WHERE "lockUuid" IS NULL AND "scheduledAt" > n.now) AS scheduled,
       count(*) FILTER (WHERE "lockUuid" IS NOT NULL AND "scheduledAt" > n.now) AS in_flight,
       count(*) FILTER (WHERE "scheduledAt" > "scheduledAtInitially"
                              AND ("lockUuid" IS NULL OR "scheduledAt" <= n.now)) AS redelivered,
       n.now - min("scheduledAt") FILTER (WHERE "scheduledAt" <= n.now) AS oldest_due_lag_ms,
       min("scheduledAt") FILTER (WHERE "lockUuid" IS NULL AND "scheduledAt" > n.now) AS next_due_at
FROM {table}, (SELECT {now} AS now) AS n
GROUP BY "pKind", n.now
ORDER BY "pKind"

-- status_capped --
-- Per-kind counters of `delayq status` with every count bounded: the kinds come from a skip
-- scan of the (pKind, scheduledAt) index (one descent per kind), then due rows and scheduled
-- rows are each counted in index order up to `cap`. Same definitions as `status`; in-flight
-- rows come from `status_in_flight`. Run after `count_plan_guard`. Rows come in no particular
-- order (the caller sorts the few kinds; a Sort node here is what the plan guard forbids).
WITH RECURSIVE kinds AS (
    (SELECT "pKind" AS kind FROM {table} ORDER BY "pKind" LIMIT 1)
    UNION ALL
    SELECT (SELECT t."pKind" FROM {table} AS t WHERE t."pKind" > kinds.kind
            ORDER BY t."pKind" LIMIT 1)
    FROM kinds WHERE kinds.kind IS NOT NULL
), n AS (SELECT {now} AS now)
SELECT k.kind, d.n AS due, d.redelivered AS due_redelivered, n.now - d.oldest AS oldest_due_lag_ms,
       s.n AS scheduled, s.redelivered AS scheduled_redelivered, s.first_at AS next_due_at
FROM kinds AS k CROSS JOIN n
CROSS JOIN LATERAL (
    SELECT count(*) AS n, count(*) FILTER (WHERE x.at > x.initially) AS redelivered,
           min(x.at) AS oldest
    FROM (SELECT "scheduledAt" AS at, "scheduledAtInitially" AS initially FROM {table}
          WHERE "pKind" = k.kind AND "scheduledAt" <= n.now
          ORDER BY "scheduledAt" LIMIT %(cap)s) AS x
) AS d
CROSS JOIN LATERAL (
    SELECT count(*) AS n, count(*) FILTER (WHERE y.at > y.initially) AS redelivered,
           min(y.at) AS first_at
    FROM (SELECT "scheduledAt" AS at, "scheduledAtInitially" AS initially FROM {table}
          WHERE "pKind" = k.kind AND "scheduledAt" > n.now AND "lockUuid" IS NULL
          ORDER BY "scheduledAt" LIMIT %(cap)s) AS y
) AS s
WHERE k.kind IS NOT NULL

-- status_in_flight --
-- Rows held under a live lease, per kind, read through the lockUuid index (in-flight rows are
-- few: workers x prefetch) and bounded by `cap`. Run after `count_plan_guard`.
SELECT x.kind, count(*) AS in_flight
FROM (SELECT "pKind" AS kind, "scheduledAt" AS at FROM {table}
      WHERE "lockUuid" IS NOT NULL ORDER BY "lockUuid" LIMIT %(cap)s) AS x
WHERE x.at > {now}
GROUP BY x.kind

-- status_estimates --
-- Where counts past the cap come from, all labelled estimates: the live-row count of the
-- cumulative statistics (pg_stat_user_tables, updated as rows come and go), the planner's
-- reltuples/relpages scaled to the table's current size (what the planner itself assumes), and
-- the share of each kind from pg_stats (the last ANALYZE). Nothing here reads the table.
SELECT c.reltuples::float8 AS reltuples, c.relpages::bigint AS relpages,
       (pg_relation_size(c.oid) / current_setting('block_size')::int)::bigint AS pages_now,
       st.n_live_tup AS live_tuples,
       ps.most_common_vals::text::text[] AS kind_values, ps.most_common_freqs::float8[] AS kind_freqs,
       ps.n_distinct::float8 AS n_distinct, ps.null_frac::float8 AS null_frac
FROM pg_class AS c
JOIN pg_namespace AS ns ON ns.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables AS st ON st.relid = c.oid
LEFT JOIN pg_stats AS ps
       ON ps.schemaname = ns.nspname AND ps.tablename = c.relname AND ps.attname = 'pKind'
WHERE c.oid = to_regclass({table_literal})
ORDER BY ps.inherited DESC NULLS LAST
LIMIT 1

-- cron_delete_other_configs --
-- installTick step 1: drop rows of this prefix that belong to any other config hash.
-- Patterns are LIKE-escaped and end in '/', so prefix `a` never matches `ab/...`.
DELETE FROM {table}
WHERE "pKind" = %(kind)s
  AND "pKey" LIKE %(prefix_pattern)s ESCAPE '\'
  AND "pKey" NOT LIKE %(config_pattern)s ESCAPE '\'

-- cron_uninstall --
-- uninstallTick: drop the rows of exactly this prefix and config hash.
DELETE FROM {table}
WHERE "pKind" = %(kind)s AND "pKey" LIKE %(config_pattern)s ESCAPE '\'

-- cron_list --
-- Installed occurrences of a prefix (all config hashes), soonest first.
SELECT "id", "pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "lockUuid", "createdAt"
FROM {table}
WHERE "pKind" = %(kind)s AND "pKey" LIKE %(prefix_pattern)s ESCAPE '\'
ORDER BY "scheduledAt"
LIMIT %(limit)s

-- cron_list_config --
-- Installed occurrences of one config hash of a prefix, soonest first, from the unique key
-- index. Their keys (`prefix/hash/ms`) differ only in the occurrence's epoch ms, 13 digits from
-- 2001 to 2286, so key order is time order, and in any collation they lie between
-- `prefix/hash/` and that followed by 20 nines (`lo`, `hi`); LIKE keeps only them. cron_list
-- walks the kind in time order instead, past every other row of the kind until it has found
-- `limit` occurrences: the next three days of a queue for a daily entry, 1.25M rows of a 5M one.
SELECT "id", "pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "lockUuid", "createdAt"
FROM {table}
WHERE "pKey" >= %(lo)s AND "pKey" <= %(hi)s AND "pKind" = %(kind)s
  AND "pKey" LIKE %(config_pattern)s ESCAPE '\'
ORDER BY "pKey"
LIMIT %(limit)s

-- migrations_ensure --
-- The ledger of applied schema versions, one row per (table, version).
CREATE TABLE IF NOT EXISTS {migrations} (
    "tableName" TEXT NOT NULL,
    "version" INTEGER NOT NULL,
    "appliedAt" TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY ("tableName", "version")
)

-- migrations_limits --
-- A migration is schema work, not a runtime statement: no statement_timeout for its
-- transaction (an index on a big table takes as long as it takes), and no lock_timeout while
-- it waits for another migrator's advisory lock (a role's 10 ms would end a worker's start
-- while another one migrates). Returns the role's lock_timeout, put back for the DDL.
SELECT current_setting('lock_timeout'), set_config('statement_timeout', '0', true),
       set_config('lock_timeout', '0', true)

-- migrations_lock --
-- Serialise concurrent migrators (several workers starting at once) on one advisory lock.
SELECT pg_advisory_xact_lock(%(lock_key)s)

-- migrations_lock_timeout --
-- The role's lock_timeout again once the advisory lock is held: the DDL waits for a table
-- lock no longer than the DBA allows (a waiting ALTER TABLE queues every statement after it).
SELECT set_config('lock_timeout', %(lock_timeout)s, true)

-- migrations_applied --
-- Versions already applied to this table.
SELECT "version" FROM {migrations} WHERE "tableName" = %(table_name)s

-- migrations_present --
-- Whether the queue table and the migrations ledger exist, from the catalog alone (no privilege
-- on them needed), and the database's name: what a command that only reads checks first, since
-- it never runs DDL (core/schema.py, require_schema).
SELECT to_regclass({table_literal}) IS NOT NULL, to_regclass({migrations_literal}) IS NOT NULL,
       current_database()

-- migrations_record --
-- Remember that a version was applied.
INSERT INTO {migrations} ("tableName", "version") VALUES (%(table_name)s, %(version)s)
ON CONFLICT DO NOTHING

-- table_schema --
-- The schema holding the queue table, for objects whose body must name it (migration 13).
SELECT n.nspname FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = {table_literal}::regclass

-- table_insert_grantees --
-- Roles (not PUBLIC, not the owner) that may INSERT into the queue table: they may publish, so
-- migration 13 lets them revoke too (least privilege kept; see schema_revoke_function).
SELECT DISTINCT r.rolname
FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
JOIN pg_roles AS r ON r.oid = a.grantee
WHERE c.oid = {table_literal}::regclass AND a.privilege_type = 'INSERT' AND a.grantee <> c.relowner
ORDER BY 1

-- table_persistence --
-- 'p' (logged) or 'u' (unlogged) for the queue table: the opt-in unlogged mode (issue 11).
SELECT c.relpersistence FROM pg_class AS c WHERE c.oid = {table_literal}::regclass

-- table_set_unlogged --
-- Opt-in: no WAL for the queue table; a PostgreSQL crash empties it (see docs/reference/transport-options.md).
ALTER TABLE {table} SET UNLOGGED

-- table_set_logged --
-- Back to the default: the table is rewritten into the WAL once, then crash-safe again.
ALTER TABLE {table} SET LOGGED

-- notify_function --
-- Wake consumers: one notification per kind with the earliest new scheduledAt ("kind:ms").
-- Statement-level on INSERT (one call per batch), row-level on UPDATE only for rows that
-- became available again (released or replaced), so acquiring and lease extension stay silent.
CREATE OR REPLACE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        PERFORM pg_notify(TG_ARGV[0], r.kind || ':' || r.at)
        FROM (SELECT "pKind" AS kind, min("scheduledAt") AS at FROM new_rows GROUP BY "pKind") AS r;
    ELSE
        PERFORM pg_notify(TG_ARGV[0], NEW."pKind" || ':' || NEW."scheduledAt");
    END IF;
    RETURN NULL;
END
$fn$

-- notify_function_complete --
-- Migration 14: the wake-up function of notify_triggers, complete. On INSERT (statement level:
-- COPY, bulk merges, raw SQL; delayq's own offers announce themselves) every distinct
-- scheduledAt of each kind, the first 1,000 one by one and a search marker (chr(30) || kind
-- || ':' || ms) at the first one left out, so a consumer learns every due time or searches
-- from the marker on (core/announce.py, core/watermark.py). The version of migration 2
-- notified the earliest row per kind only, and the later rows of a load waited for the
-- consumers' next-due search. Row level on UPDATE as before: only rows that became available
-- again (released or replaced), so acquiring and lease extension stay silent. Replaced in
-- place: the triggers keep calling it by name.
CREATE OR REPLACE FUNCTION {notify_fn}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        PERFORM pg_notify(TG_ARGV[0], CASE WHEN d.n > 1000 THEN chr(30) ELSE '' END
                                      || d.kind || ':' || d.at)
        FROM (SELECT u.kind, u.at, row_number() OVER (PARTITION BY u.kind ORDER BY u.at) AS n
              FROM (SELECT DISTINCT "pKind" AS kind, "scheduledAt" AS at FROM new_rows) AS u
             ) AS d
        WHERE d.n <= 1001;
    ELSE
        PERFORM pg_notify(TG_ARGV[0], NEW."pKind" || ':' || NEW."scheduledAt");
    END IF;
    RETURN NULL;
END
$fn$

-- notify_triggers --
-- Attach the wake-up function to the table (idempotent).
DROP TRIGGER IF EXISTS {insert_trigger} ON {table};
CREATE TRIGGER {insert_trigger} AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {notify_fn}({channel_literal});
DROP TRIGGER IF EXISTS {update_trigger} ON {table};
CREATE TRIGGER {update_trigger} AFTER UPDATE ON {table}
    FOR EACH ROW WHEN (NEW."lockUuid" IS NULL)
    EXECUTE FUNCTION {notify_fn}({channel_literal})

-- notify_insert_trigger_skip --
-- Migration 5: the insert trigger of notify_triggers, now skipped by statements whose wake-up
-- is sent otherwise (offer_insert and offer_batch_insert mark delayq.notified_at with their
-- statement_timestamp, which no other statement of the transaction shares; core/announce.py
-- sends it after the commit). COPY, bulk merges and raw SQL inserts still notify through it. Replaced in one transaction: no insert goes unnoticed.
DROP TRIGGER IF EXISTS {insert_trigger} ON {table};
CREATE TRIGGER {insert_trigger} AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT
    WHEN (current_setting('delayq.notified_at', true) IS DISTINCT FROM statement_timestamp()::text)
    EXECUTE FUNCTION {notify_fn}({channel_literal})

-- queue_autovacuum --
-- Migration 4: vacuum and analyze the queue table after ~1% of its rows changed (1,000 at
-- least), not the default 20%: a queue churns a small due region on top of a large far-future
-- backlog, and its dead index entries are what each poll has to walk (docs/explanation/scaling.md). Also
-- analyzes a freshly bulk-loaded table soon. SHARE UPDATE EXCLUSIVE: it waits neither for DML
-- nor for pg_dump's ACCESS SHARE, so it applies to a live table.
ALTER TABLE {table} SET (
    autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01, autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.01, autovacuum_analyze_threshold = 1000
)

-- queue_fillfactor --
-- Migration 6: pages filled to half by inserts, so a row's lease, lease extension and release
-- (UPDATEs of the indexed scheduledAt and lockUuid: never HOT) put the new version on the
-- row's own page, which PostgreSQL logs as the changed bytes only, not the whole row: lease WAL
-- per row 1,403 -> 590 bytes for a Celery no-op, extension 1,018 -> 432, a delivery's total
-- 3,233 -> 2,421 (bench/diagnostics/fillfactor.py; 90 and 70 saved 8% and 17%). Costs heap
-- space for rows that wait (countdowns): half-full pages. SHARE UPDATE EXCLUSIVE, no rewrite:
-- it waits neither for DML nor for pg_dump, and pages written from then on follow it.
ALTER TABLE {table} SET (fillfactor = 50)

-- session_marker --
-- core/db.py: the marker setting sent with delayq's startup options, read back once: missing
-- when something between delayq and PostgreSQL (PgBouncer) refused or dropped the options.
SELECT current_setting(%(name)s, true)

-- database_identity --
-- core/joined.py: which database a connection reaches, compared before a publish joins a
-- caller's transaction. The cluster's system identifier and start time tell apart two servers
-- (a restored copy shares the identifier, not the start); the name tells apart its databases.
-- Host names cannot: one server answers to several, and PgBouncer stands in for it.
SELECT current_database()::text, (SELECT system_identifier FROM pg_control_system())::text,
       pg_postmaster_start_time()::text

-- listen --
-- Subscribe a connection to this table's wake-ups.
LISTEN {channel}

-- announce --
-- core/announce.py: this process' wake-ups ("kind:ms", the earliest new scheduledAt of each
-- kind), sent after the publishes' commits in a transaction of their own, at most one per
-- short window (a leading one at once, a trailing one at the window's end). Its transaction
-- commits without waiting for the WAL flush (SET LOCAL, whatever the session's setting): a
-- wake-up lost in a server crash only delays a pick-up to the consumers' fallback poll.
SELECT set_config('synchronous_commit', 'off', true), pg_notify({channel_literal}, p)
FROM unnest(%(payloads)s::text[]) AS p

-- listen_probe --
-- core/listen.py: a notification sent from another (pooled) connection, which a new LISTEN
-- connection waits for: behind a pooler LISTEN succeeds and its notifications never arrive.
SELECT pg_notify({channel_literal}, %(payload)s)

-- unlisten --
-- core/listen.py: leave the channel before giving up on a LISTEN that cannot deliver, so the
-- server session a pooler hands to someone else does not keep receiving every wake-up.
UNLISTEN *

-- bindings_upsert --
-- Record (or refresh) an exchange binding so every process routes the same way.
INSERT INTO {bindings} ("exchange", "routingKey", "queue", "pattern", "exchangeType", "autoDelete", "seenAt")
VALUES (%(exchange)s, %(routing_key)s, %(queue)s, %(pattern)s, %(exchange_type)s, %(auto_delete)s, {now})
ON CONFLICT ("exchange", "routingKey", "queue") DO UPDATE
SET "pattern" = EXCLUDED."pattern", "exchangeType" = EXCLUDED."exchangeType",
    "autoDelete" = EXCLUDED."autoDelete", "seenAt" = EXCLUDED."seenAt"

-- bindings_for_exchange --
-- Routing table of one exchange as every process declared it. Auto-delete queues count only
-- while their consumer was seen recently (a dead `celery events` must not collect forever).
SELECT "routingKey", "pattern", "queue" FROM {bindings}
WHERE "exchange" = %(exchange)s
  AND (NOT "autoDelete" OR "seenAt" > {now} - %(live_ms)s::bigint)

-- bindings_touch --
-- Consumers mark their queues alive; fanout only reaches queues seen recently (Redis-like).
UPDATE {bindings} SET "seenAt" = {now} WHERE "queue" = ANY(%(queues)s::text[])

-- bindings_delete_queue --
-- queue_delete: forget every binding of a queue.
DELETE FROM {bindings} WHERE "queue" = %(queue)s

-- bindings_has_queue --
-- Whether any process declared a binding for this queue (passive queue_declare).
SELECT 1 FROM {bindings} WHERE "queue" = %(queue)s LIMIT 1

-- fanout_insert --
-- One copy of a broadcast per queue bound to the exchange and consumed recently, in one statement.
INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
SELECT %(key)s, b."queue", %(payload)s, {now}, {now}, {now}
FROM {bindings} AS b
WHERE b."exchange" = %(exchange)s AND b."seenAt" > {now} - %(live_ms)s::bigint
ON CONFLICT ("pKey", "pKind") DO NOTHING

-- janitor_transient_queues --
-- Drop auto-delete queues whose consumers vanished (SIGKILLed `celery inspect`, dead workers'
-- pidbox): their bindings, then their waiting rows, so broadcasts cannot pile up forever.
WITH stale AS (
    DELETE FROM {bindings}
    WHERE "autoDelete" AND "seenAt" < {now} - %(stale_ms)s::bigint
    RETURNING "queue"
)
DELETE FROM {table} AS t
WHERE t."pKind" IN (SELECT "queue" FROM stale) AND t."lockUuid" IS NULL
  AND NOT EXISTS (SELECT 1 FROM {bindings} AS b
                  WHERE b."queue" = t."pKind" AND b."seenAt" >= {now} - %(stale_ms)s::bigint)

-- scan_bounds --
-- Id range of the whole table and the database clock, so queue_dataframe can split its read.
SELECT min("id") AS lo, max("id") AS hi, {now} AS now FROM {table}

-- bulk_session_setup --
-- core/bulk.py: before the staging table exists in this session (PostgreSQL only takes it then),
-- room for a whole flush in local buffers, so staged rows are not written out to temp files.
SET temp_buffers = '128MB'

-- bulk_stage_create --
-- core/bulk.py: the per-connection staging table bulk writers COPY into (dropped with the
-- session; no migration). Same column types as the queue table so the merge casts nothing.
CREATE TEMP TABLE IF NOT EXISTS {stage} (
    "key" text NOT NULL, "kind" text NOT NULL, "payload" bytea NOT NULL, "at" bigint NOT NULL
)

-- bulk_stage_copy --
-- core/bulk.py: binary COPY of (key, kind, payload, at) tuples into the staging table.
COPY {stage} ("key", "kind", "payload", "at") FROM STDIN (FORMAT binary)

-- bulk_stage_truncate --
-- core/bulk.py: empty the staging table after a merge.
TRUNCATE {stage}

-- bulk_stage_drop --
-- core/bulk.py, behind a transaction pooler: drop the staging table before the commit, so the
-- server session the pooler lends to another client next keeps no table of ours.
DROP TABLE IF EXISTS {stage}

-- bulk_merge_ignore --
-- core/bulk.py: move staged rows into the queue; a key that exists (or repeats) is left alone,
-- so the row count is what was created. Ordered by key: two writers merging overlapping keys
-- lock them in the same order and cannot deadlock.
INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
SELECT s."key", s."kind", s."payload", s."at", s."at", {now}
FROM {stage} AS s
ORDER BY s."key", s."kind"
ON CONFLICT ("pKey", "pKind") DO NOTHING

-- bulk_merge_update --
-- core/bulk.py: like bulk_merge_ignore, but a key that exists is replaced in place unless it is
-- identical and not in flight (offer()'s rule); RETURNING tells created (xmax = 0) from
-- updated, every staged row not returned was ignored. DISTINCT ON: a statement may not touch
-- one row twice, so one of the staged rows sharing a key wins.
INSERT INTO {table} AS t ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                          "createdAt")
SELECT DISTINCT ON (s."key", s."kind") s."key", s."kind", s."payload", s."at", s."at", {now}
FROM {stage} AS s
ORDER BY s."key", s."kind"
ON CONFLICT ("pKey", "pKind") DO UPDATE
SET "payload" = EXCLUDED."payload", "scheduledAt" = EXCLUDED."scheduledAt",
    "scheduledAtInitially" = EXCLUDED."scheduledAtInitially", "lockUuid" = NULL,
    "createdAt" = EXCLUDED."createdAt"
WHERE t."payload" IS DISTINCT FROM EXCLUDED."payload"
   OR t."scheduledAtInitially" <> EXCLUDED."scheduledAtInitially"
   OR t."lockUuid" IS NOT NULL
RETURNING (t.xmax = 0) AS created

-- runs_part --
-- core/runs.py: whether one part of a run was applied, asked before its writer stages anything.
SELECT "rows", "fingerprint" FROM {runs} WHERE "runId" = %(run_id)s AND "part" = %(part)s

-- runs_record --
-- core/runs.py: a part applied, in the transaction that merged its rows (or, part -1, a whole
-- run). No row back: an attempt running at the same time recorded it first (this insert
-- waited for that attempt's commit), and the caller rolls back its own rows.
INSERT INTO {runs} ("runId", "part", "rows", "fingerprint", "appliedAt")
VALUES (%(run_id)s, %(part)s, %(rows)s, %(fingerprint)s, {now})
ON CONFLICT ("runId", "part") DO NOTHING
RETURNING 1

-- runs_state --
-- core/runs.py: every entry of one run: its parts, and part -1 once the whole run is in.
SELECT "part", "rows", "fingerprint" FROM {runs} WHERE "runId" = %(run_id)s

-- runs_prune --
-- core/runs.py: retention. Entries older than the retention, at most %(limit)s per call, found
-- through the appliedAt index (a call that finds none reads one index page).
DELETE FROM {runs}
WHERE ("runId", "part") IN (
    SELECT "runId", "part" FROM {runs}
    WHERE "appliedAt" < {now} - %(retention_ms)s::bigint
    LIMIT %(limit)s)

-- runs_forget --
-- core/runs.py: drop a run's entries, so its next attempt applies everything again.
DELETE FROM {runs} WHERE "runId" = %(run_id)s

-- runs_prune_part --
-- core/runs.py: retention of one kind of entry (`part`), at most %(limit)s per call, through the
-- appliedAt index: beat occurrences recorded in django-celery-beat's run history (part -3) are
-- kept a day, whatever retention Spark's runs use.
DELETE FROM {runs}
WHERE ("runId", "part") IN (
    SELECT "runId", "part" FROM {runs}
    WHERE "appliedAt" < {now} - %(retention_ms)s::bigint AND "part" = %(part)s
    LIMIT %(limit)s)

-- djbeat_present --
-- core/djbeat.py: whether django-celery-beat's tables are in this database (its task table, from
-- the catalog alone), so a listing that merely may show them asks before it reads: a read of a
-- missing table is an error in the server's log at every refresh of the page.
SELECT to_regclass({djbeat_task_literal}) IS NOT NULL

-- djbeat_read --
-- core/djbeat.py: django-celery-beat's change mark (PeriodicTasks.last_update, bumped by its
-- saves, deletes and the admin's bulk actions) and, when it differs from the mark the caller
-- last saw (or with `force`), every periodic task with its schedule. Unchanged: one row whose
-- task columns are NULL. `schedules` counts the schedule references a task has (one is valid).
WITH mark AS (SELECT max("last_update") AS last_update FROM {djbeat_track})
SELECT m.last_update, t."name", t."task", t."args", t."kwargs", t."queue", t."exchange",
       t."routing_key", t."headers", t."priority", t."expires", t."expire_seconds", t."one_off",
       t."start_time", t."enabled", t."last_run_at", t."total_run_count", t."date_changed",
       t."description", i."every", i."period", c."minute", c."hour", c."day_of_week",
       c."day_of_month", c."month_of_year", c."timezone", s."event", s."latitude"::text,
       s."longitude"::text, k."clocked_time",
       (t."interval_id" IS NOT NULL)::int + (t."crontab_id" IS NOT NULL)::int
           + (t."solar_id" IS NOT NULL)::int + (t."clocked_id" IS NOT NULL)::int AS schedules
FROM mark AS m
LEFT JOIN {djbeat_task} AS t
       ON %(force)s OR m.last_update IS DISTINCT FROM %(seen)s::timestamptz
LEFT JOIN {djbeat_interval} AS i ON i."id" = t."interval_id"
LEFT JOIN {djbeat_crontab} AS c ON c."id" = t."crontab_id"
LEFT JOIN {djbeat_solar} AS s ON s."id" = t."solar_id"
LEFT JOIN {djbeat_clocked} AS k ON k."id" = t."clocked_id"
ORDER BY t."name"

-- djbeat_set_enabled --
-- core/djbeat.py: enable or disable periodic tasks by name (`delayq beat import
-- --disable-source` and `--undo`) and bump the change mark, as the admin's bulk actions do, so
-- django-celery-beat's beat and delayq's see it. Returns the names it changed.
WITH changed AS (
    UPDATE {djbeat_task} SET "enabled" = %(enabled)s
    WHERE "name" = ANY(%(names)s::text[]) AND "enabled" <> %(enabled)s
    RETURNING "name"),
bump AS (
    INSERT INTO {djbeat_track} ("ident", "last_update")
    SELECT 1, now() WHERE EXISTS (SELECT 1 FROM changed)
    ON CONFLICT ("ident") DO UPDATE SET "last_update" = EXCLUDED."last_update")
SELECT "name" FROM changed ORDER BY "name"

-- djbeat_record_runs --
-- core/djbeat.py: beat occurrences a worker received, written to their periodic task's run
-- history once each: every occurrence key is claimed in the run ledger (`part` -3) by this
-- same statement (in key order, as once_claim: no deadlock between workers), so a redelivery or
-- a second worker adds nothing. last_run_at becomes the
-- newest occurrence's instant; a one-off is disabled with its count reset, as
-- django-celery-beat's scheduler leaves it after its run, and only then is the change mark
-- bumped (run history alone does not bump it in django-celery-beat either).
WITH claimed AS (
    INSERT INTO {runs} ("runId", "part", "rows", "fingerprint", "appliedAt")
    SELECT DISTINCT r.key, %(part)s, 1, 0, {now}
    FROM unnest(%(keys)s::text[]) AS r(key)
    ORDER BY r.key
    ON CONFLICT ("runId", "part") DO NOTHING
    RETURNING "runId"),
ran AS (
    SELECT r.name, count(*) AS n, max(r.at_ms) AS at_ms
    FROM unnest(%(keys)s::text[], %(names)s::text[], %(ats)s::bigint[]) AS r(key, name, at_ms)
    JOIN claimed AS c ON c."runId" = r.key
    GROUP BY r.name),
done AS (
    UPDATE {djbeat_task} AS t
    SET "last_run_at" = GREATEST(t."last_run_at", to_timestamp(ran.at_ms / 1000.0)),
        "total_run_count" = CASE WHEN t."one_off" THEN 0 ELSE t."total_run_count" + ran.n END,
        "enabled" = t."enabled" AND NOT t."one_off"
    FROM ran WHERE t."name" = ran.name
    RETURNING t."one_off"),
bump AS (
    INSERT INTO {djbeat_track} ("ident", "last_update")
    SELECT 1, now() WHERE EXISTS (SELECT 1 FROM done WHERE "one_off")
    ON CONFLICT ("ident") DO UPDATE SET "last_update" = EXCLUDED."last_update")
SELECT count(*) FROM done

-- once_claim --
-- core/once.py: record the ids of the messages offer_once() is about to insert, in the
-- transaction of their rows. An id already recorded is not returned: that message was offered
-- before, and nothing of it is written again. A concurrent claim of one id waits for this one;
-- ids are claimed in order, so two callers claiming overlapping ids cannot deadlock.
INSERT INTO {runs} ("runId", "part", "rows", "fingerprint", "appliedAt")
SELECT s.id, %(part)s, 1, 0, {now} FROM unnest(%(ids)s::text[]) AS s(id) ORDER BY s.id
ON CONFLICT ("runId", "part") DO NOTHING
RETURNING "runId"

-- once_identical --
-- core/once.py: which offers whose key was taken find their very payload there (the message
-- itself, offered before: recorded, nothing written); the others are conflicts. Each pair
-- is one probe of the unique (pKey, pKind) index.
SELECT s.id
FROM unnest(%(ids)s::text[], %(keys)b::text[], %(kinds)b::text[], %(payloads)b::bytea[])
     AS s(id, key, kind, payload)
JOIN {table} AS t ON t."pKey" = s.key AND t."pKind" = s.kind AND t."payload" = s.payload

-- once_forget --
-- core/once.py: drop once-offered ids (their messages left their source, or were conflicts
-- of this very transaction); the ledger's primary key finds each.
DELETE FROM {runs} WHERE "part" = %(part)s AND "runId" = ANY(%(ids)s::text[])

-- bulk_copy_direct --
-- core/bulk.py: binary COPY straight into the queue table (no conflict handling). Only the
-- benchmark uses it, as the raw write limit the bulk writers are measured against.
COPY {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
FROM STDIN (FORMAT binary)

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

-- Statements of delayq_beat (the beat scheduler) follow.
-- Statements of delayq_beat: DB-backed schedule entries, the ledger of installed entries (so a
-- removed entry is uninstalled across restarts) and the misfire policy.

-- beat_entry_upsert --
-- Add or replace a DB-backed beat entry (definition = task, schedule, args, kwargs, options).
INSERT INTO "delayq_beat_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
VALUES (%(table_name)s, %(name)s, %(definition)s::jsonb, %(enabled)s, {now})
ON CONFLICT ("tableName", "name") DO UPDATE
SET "definition" = EXCLUDED."definition", "enabled" = EXCLUDED."enabled",
    "updatedAt" = EXCLUDED."updatedAt"

-- beat_entry_set_enabled --
-- Enable/disable an entry; for a beat_schedule entry this stores an override row (no definition).
INSERT INTO "delayq_beat_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
VALUES (%(table_name)s, %(name)s, NULL, %(enabled)s, {now})
ON CONFLICT ("tableName", "name") DO UPDATE
SET "enabled" = EXCLUDED."enabled", "updatedAt" = EXCLUDED."updatedAt"
RETURNING "definition" IS NOT NULL AS has_definition

-- beat_entries_upsert_many --
-- `delayq beat import`: add or replace many DB-backed entries in one statement, all or none.
INSERT INTO "delayq_beat_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
SELECT %(table_name)s, e.name, e.definition::jsonb, e.enabled, {now}
FROM unnest(%(names)s::text[], %(definitions)s::text[], %(enableds)s::boolean[])
     AS e(name, definition, enabled)
ON CONFLICT ("tableName", "name") DO UPDATE
SET "definition" = EXCLUDED."definition", "enabled" = EXCLUDED."enabled",
    "updatedAt" = EXCLUDED."updatedAt"

-- beat_entries_delete_many --
-- `delayq beat import --undo`: remove the entries an import added; returns the names removed.
DELETE FROM "delayq_beat_entries"
WHERE "tableName" = %(table_name)s AND "name" = ANY(%(names)s::text[])
RETURNING "name"

-- beat_entry_delete --
-- Remove a DB-backed entry (or an enable/disable override).
DELETE FROM "delayq_beat_entries" WHERE "tableName" = %(table_name)s AND "name" = %(name)s

-- beat_entries_list --
-- Every DB-backed entry and override of one queue table.
SELECT "name", "definition", "enabled", "updatedAt"
FROM "delayq_beat_entries" WHERE "tableName" = %(table_name)s ORDER BY "name"

-- beat_installed_list --
-- The ledger: which entries have occurrences installed, in which kind, under which config hash,
-- and since when (firstInstalledAt: recorded only for entries that need it, see below).
SELECT "name", "kind", "configHash", "installedUntil", "updatedAt", "firstInstalledAt"
FROM "delayq_beat_installed" WHERE "tableName" = %(table_name)s ORDER BY "name"

-- beat_first_install --
-- The first install of an entry's configuration, claimed once: the first scheduler to install
-- it under this config hash records the database clock (and installedUntil: nothing before it is
-- owed); every other one, at the same time or later, reads that time back. A changed hash starts
-- afresh. `inserted` tells the one scheduler whose claim it was (a one-off already due runs once).
INSERT INTO "delayq_beat_installed" AS i
    ("tableName", "name", "kind", "configHash", "installedUntil", "updatedAt", "firstInstalledAt")
VALUES (%(table_name)s, %(name)s, %(kind)s, %(hash)s, {now}, {now}, {now})
ON CONFLICT ("tableName", "name") DO UPDATE
SET "firstInstalledAt" = CASE
        WHEN i."configHash" = EXCLUDED."configHash" AND i."firstInstalledAt" IS NOT NULL
        THEN i."firstInstalledAt" ELSE EXCLUDED."firstInstalledAt" END,
    "installedUntil" = CASE
        WHEN i."configHash" = EXCLUDED."configHash" THEN i."installedUntil"
        ELSE EXCLUDED."installedUntil" END,
    "kind" = EXCLUDED."kind", "configHash" = EXCLUDED."configHash",
    "updatedAt" = EXCLUDED."updatedAt"
RETURNING "firstInstalledAt", "installedUntil", (xmax = 0) AS inserted

-- beat_ledger_first_install_column --
-- Migration 12: the ledger records when each entry's configuration was first installed.
ALTER TABLE "delayq_beat_installed" ADD COLUMN IF NOT EXISTS "firstInstalledAt" BIGINT

-- beat_tables_in_use --
-- Whether any beat entry or installed ledger row exists for one queue table: ``delayq status``
-- loads the beat plugin (and Celery) only then.
SELECT EXISTS (SELECT 1 FROM "delayq_beat_entries" WHERE "tableName" = %(table_name)s)
    OR EXISTS (SELECT 1 FROM "delayq_beat_installed" WHERE "tableName" = %(table_name)s)

-- beat_installed_upsert --
-- Record installs of many entries at once. installedUntil only grows for an unchanged config,
-- so a beat with a stale view never makes another one re-offer its whole horizon.
INSERT INTO "delayq_beat_installed" AS i
    ("tableName", "name", "kind", "configHash", "installedUntil", "updatedAt")
SELECT %(table_name)s, s.name, s.kind, s.hash, s.until, {now}
FROM unnest(%(names)s::text[], %(kinds)s::text[], %(hashes)s::text[], %(untils)s::bigint[])
     AS s(name, kind, hash, until)
ON CONFLICT ("tableName", "name") DO UPDATE
SET "installedUntil" = CASE
        WHEN i."configHash" = EXCLUDED."configHash" AND i."kind" = EXCLUDED."kind"
        THEN GREATEST(i."installedUntil", EXCLUDED."installedUntil")
        ELSE EXCLUDED."installedUntil" END,
    "kind" = EXCLUDED."kind", "configHash" = EXCLUDED."configHash",
    "updatedAt" = EXCLUDED."updatedAt"

-- beat_installed_delete --
-- Forget entries whose occurrences were uninstalled (removed, disabled or renamed).
DELETE FROM "delayq_beat_installed"
WHERE "tableName" = %(table_name)s AND "name" = ANY(%(names)s::text[])

-- beat_misfire_sweep --
-- Beat refresh: delete waiting occurrences that misfired (due longer ago than their entry's
-- grace). `skip` drops every misfired one; `coalesce` keeps only the newest due occurrence of
-- each entry. Rows in flight are never touched. One statement for all entries.
WITH e AS (
    SELECT * FROM unnest(%(kinds)s::text[], %(patterns)s::text[], %(policies)s::text[],
                         %(grace_ms)s::bigint[]) AS e(kind, pattern, policy, grace_ms)
), n AS (SELECT {now} AS now),
due AS (
    SELECT t."id", t."lockUuid", e.policy,
           t."scheduledAtInitially" < n.now - e.grace_ms AS misfired,
           row_number() OVER (PARTITION BY e.kind, e.pattern
                              ORDER BY t."scheduledAtInitially" DESC) AS rank
    FROM e CROSS JOIN n
    JOIN {table} AS t ON t."pKind" = e.kind AND t."scheduledAt" <= n.now
                     AND t."pKey" LIKE e.pattern ESCAPE '\'
)
DELETE FROM {table} AS t USING due
WHERE t."id" = due."id" AND t."lockUuid" IS NULL AND due.misfired
  AND (due.policy = 'skip' OR (due.policy = 'coalesce' AND due.rank > 1))
RETURNING t."pKey", t."pKind"

-- beat_newer_due --
-- Worker side of `coalesce`: is a newer occurrence of the same entry and config already due?
SELECT EXISTS (
    SELECT 1 FROM {table}
    WHERE "pKind" = %(kind)s AND "scheduledAt" > %(at_ms)s
      AND "scheduledAtInitially" > %(at_ms)s AND "scheduledAtInitially" <= {now}
      AND "pKey" LIKE %(pattern)s ESCAPE '\'
) AS newer

-- beat_catch_up --
-- A refresh after no scheduler ran past the end of an entry's installed horizon: insert the
-- runs the misfire policy keeps of the occurrences never installed (due at once: scheduledAt
-- is now, scheduledAtInitially the occurrence), and the new horizon, only if this statement
-- moves the entry's ledger row on from the installedUntil this refresh read. A scheduler that
-- read the same row waits on its lock, finds it moved and inserts nothing, so a gap is caught
-- up once however many schedulers restart together; the runs skip min_lead (they are due
-- already) without a later scheduler reviving them. Horizon rows (after `gap_end`) keep
-- offer_batch_insert's min_lead. `claimed` is 0 when another scheduler took the gap.
WITH claim AS (
    UPDATE "delayq_beat_installed"
    SET "installedUntil" = %(until)s, "updatedAt" = {now}
    WHERE "tableName" = %(table_name)s AND "name" = %(name)s AND "kind" = %(kind)s::text
      AND "configHash" = %(hash)s AND "installedUntil" = %(seen_until)s
    RETURNING "name"
), ins AS (
    INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    SELECT s.key, %(kind)s::text, s.payload, GREATEST(s.at, {now}), s.at, {now}
    FROM unnest(%(keys)b::text[], %(payloads)b::bytea[], %(ats)b::bigint[]) AS s(key, payload, at)
    WHERE EXISTS (SELECT 1 FROM claim)
      AND (s.at <= %(gap_end)s::bigint OR s.at > {now} + %(min_lead_ms)s::bigint)
    ON CONFLICT ("pKey", "pKind") DO NOTHING
    RETURNING "pKey"
)
SELECT (SELECT count(*) FROM claim) AS claimed, ARRAY(SELECT "pKey" FROM ins) AS created

-- Statements of the demo (`delayq demo`): its Celery app logs each run of its tasks so the
-- live view can show scheduled -> running -> done. Not part of the queue.

-- demo_claim --
-- `delayq demo` runs one at a time per database: a session advisory lock held while it runs.
SELECT pg_try_advisory_lock(%(lock_key)s)

-- demo_table_marks --
-- Which of the demo's table names exist here, and whether each carries the demo's mark (a
-- table of that name the demo did not create is refused, never reused).
SELECT n.name, obj_description(to_regclass(quote_ident(n.name)), 'pg_class')
               IS NOT DISTINCT FROM {demo_mark} AS ours
FROM unnest(%(names)s::text[]) AS n(name)
WHERE to_regclass(quote_ident(n.name)) IS NOT NULL

-- demo_mark_tables --
-- Mark the tables the demo created (its queue table, bindings, run ledger and run log).
COMMENT ON TABLE {table} IS {demo_mark};
COMMENT ON TABLE {bindings} IS {demo_mark};
COMMENT ON TABLE {runs} IS {demo_mark};
COMMENT ON TABLE {demo_log} IS {demo_mark}

-- runlog_create --
-- The demo's run log, next to its queue table.
CREATE TABLE IF NOT EXISTS {demo_log} (
    task_id TEXT NOT NULL, attempt INT NOT NULL, state TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (task_id, attempt, state))

-- runlog_reset --
-- Start the demo's run log afresh (its own table: checked to carry the demo's mark first).
DELETE FROM {demo_log}

-- runlog_record --
-- One step of one run of a demo task (running, retrying, done).
INSERT INTO {demo_log} (task_id, attempt, state) VALUES (%(task_id)s, %(attempt)s, %(state)s)
ON CONFLICT DO NOTHING

-- runlog_list --
-- Every step so far, oldest first (the view keeps each task's latest).
SELECT task_id, state, at FROM {demo_log} ORDER BY at

-- Statements of `delayq uninstall` (core/uninstall.py): it lists, then drops, only what delayq
-- created for one queue table, by exact name, and refuses while anything else is attached.

-- uninstall_relations --
-- Which of these names are relations here: name, kind, estimated rows, demo mark.
SELECT n.name, c.relkind::text, greatest(c.reltuples, 0)::bigint AS rows_estimate,
       obj_description(c.oid, 'pg_class') IS NOT DISTINCT FROM {demo_mark} AS demo_marked
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS n(name, ord)
JOIN pg_class AS c ON c.oid = to_regclass(quote_ident(n.name))
ORDER BY n.ord

-- uninstall_queue_rows --
-- The queue table's rows (every task uninstall would drop), counted up to a cap.
SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT %(cap)s) AS s

-- uninstall_attached --
-- Indexes and (user) triggers on these tables, each with its table: what DROP TABLE removes too.
SELECT 'index' AS kind, i.relname::text AS name, t.relname::text AS on_table
FROM pg_index AS x JOIN pg_class AS i ON i.oid = x.indexrelid JOIN pg_class AS t ON t.oid = x.indrelid
WHERE x.indrelid = ANY(ARRAY(SELECT to_regclass(quote_ident(n)) FROM unnest(%(tables)s::text[]) AS n))
UNION ALL
SELECT 'trigger', g.tgname::text, t.relname::text
FROM pg_trigger AS g JOIN pg_class AS t ON t.oid = g.tgrelid
WHERE NOT g.tgisinternal
  AND g.tgrelid = ANY(ARRAY(SELECT to_regclass(quote_ident(n)) FROM unnest(%(tables)s::text[]) AS n))
ORDER BY 3, 1, 2

-- uninstall_functions --
-- The table's functions that exist: the NOTIFY trigger's, the revoke function, the search one.
SELECT f::regprocedure::text FROM unnest(ARRAY[
    to_regprocedure({notify_fn_literal} || '()'),
    to_regprocedure({revoke_fn_literal} || '(text[])'),
    to_regprocedure({search_fn_literal} || '(bytea)')]) AS f
WHERE f IS NOT NULL

-- uninstall_other_tables --
-- Queue tables other than this one that the ledger records: the shared tables stay for them.
SELECT DISTINCT "tableName" FROM {migrations} WHERE "tableName" <> %(table_name)s ORDER BY 1

-- uninstall_drop_tables --
-- The queue table (its indexes, triggers and id sequence go with it), bindings and run ledger.
-- No CASCADE: a view or foreign key of the user's on them makes this fail, and nothing drops.
DROP TABLE IF EXISTS {table}, {bindings}, {runs}

-- uninstall_drop_demo_log --
-- The run log `delayq demo` created next to its table (dropped only when it carries the mark).
DROP TABLE IF EXISTS {demo_log}

-- uninstall_drop_functions --
-- The table's functions, once nothing depends on them.
DROP FUNCTION IF EXISTS {notify_fn}(), {revoke_fn}(text[]), {search_fn}(bytea)

-- uninstall_forget_ledger --
-- The table's rows in the migrations ledger.
DELETE FROM {migrations} WHERE "tableName" = %(table_name)s

-- uninstall_forget_beat --
-- The table's beat entries and installed-entry ledger rows.
WITH entries AS (DELETE FROM "delayq_beat_entries" WHERE "tableName" = %(table_name)s)
DELETE FROM "delayq_beat_installed" WHERE "tableName" = %(table_name)s

-- uninstall_forget_task_results --
-- The table's task results (core/task_results.py).
DELETE FROM "delayq_task_results" WHERE "tableName" = %(table_name)s

-- uninstall_drop_shared --
-- The tables every queue table of the database shares, once no queue table is left.
DROP TABLE IF EXISTS {migrations}, "delayq_beat_entries", "delayq_beat_installed",
    "delayq_task_results"

-- Blocks named schema_* take {schema} (the queue table's schema) and, for grants, {role} as
-- extra identifiers, like the grant_* blocks below; core/schema.py renders them at migration.

-- schema_revoke_function --
-- Migration 13: revoke a waiting task by its key. SECURITY DEFINER: it runs as the table's
-- owner, so a producer, which has no DELETE on the table, may delete a row it names and
-- nothing more: exact keys only (no pattern), only rows no consumer holds ("lockUuid" IS NULL,
-- re-checked under the row lock if a worker leases it meanwhile), only in this table (its
-- name and schema are fixed in the body, the search_path is pinned so no object of the
-- caller's can stand in). PUBLIC may not execute it; the roles that may are granted below.
CREATE OR REPLACE FUNCTION {schema}.{revoke_fn}(keys text[])
RETURNS TABLE ("pKey" text, "pKind" text)
LANGUAGE sql VOLATILE STRICT SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DELETE FROM {schema}.{table} AS t
WHERE t."pKey" = ANY(keys) AND t."lockUuid" IS NULL
RETURNING t."pKey"::text, t."pKind"::text
$fn$;
REVOKE ALL ON FUNCTION {schema}.{revoke_fn}(text[]) FROM PUBLIC

-- schema_revoke_grant --
-- Migration 13: a role that may INSERT (publish) may revoke a waiting task by key.
GRANT EXECUTE ON FUNCTION {schema}.{revoke_fn}(text[]) TO {role}

-- Least-privilege GRANTs printed by `delayq grants` (never run by delayq itself). Blocks named
-- grant_* take {role} and {schema} as extra identifiers; see docs/how-to/roles.md.

-- grant_admin --
-- The one role that runs `delayq migrate`: it creates the tables, so it owns them (later
-- migrations ALTER them); pg_monitor lets `delayq status` see every session holding back cleanup.
GRANT USAGE, CREATE ON SCHEMA {schema} TO {role};
GRANT pg_monitor TO {role}

-- grant_worker --
-- Celery workers: poll (SELECT ... FOR UPDATE SKIP LOCKED + UPDATE of the lease), ack (DELETE),
-- extend leases and release (UPDATE), publish (tasks send tasks, retries, replies: INSERT and the
-- id sequence), route (bindings), and read the migrations ledger on start. LISTEN needs no grant.
-- Spark jobs run as this role (or as a producer) record and prune the run ledger (runs).
-- Django's task workers record each attempt in the task results and prune them.
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.{table}, {schema}.{bindings} TO {role};
GRANT USAGE ON SEQUENCE {schema}.{sequence} TO {role};
GRANT SELECT ON {schema}.{migrations} TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.{runs} TO {role};
GRANT EXECUTE ON FUNCTION {schema}.{revoke_fn}(text[]) TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}."delayq_task_results" TO {role}

-- grant_beat --
-- celery beat with the delayq scheduler (run it as the worker role): its two state tables.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}."delayq_beat_entries", {schema}."delayq_beat_installed" TO {role}

-- grant_producer --
-- Applications that only publish (apply_async): INSERT rows, read the queue size kombu asks for
-- on every queue declaration (SELECT), declare bindings (no DELETE), read the ledger. Without
-- UPDATE and DELETE a producer cannot take, delay or delete anyone's rows; revoking a waiting
-- task it names goes through the revoke function (EXECUTE). Spark jobs (often run as a
-- producer) record applied parts in the run ledger and prune it (DELETE there only). Django's
-- get_result reads the task results (SELECT).
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT ON {schema}.{table} TO {role};
GRANT USAGE ON SEQUENCE {schema}.{sequence} TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.{bindings} TO {role};
GRANT SELECT ON {schema}.{migrations} TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.{runs} TO {role};
GRANT EXECUTE ON FUNCTION {schema}.{revoke_fn}(text[]) TO {role};
GRANT SELECT ON {schema}."delayq_task_results" TO {role}

-- grant_monitor --
-- `delayq status` / `delayq metrics` for a dashboard or Prometheus: read-only (the beat tables too:
-- status lists periodic entries), plus pg_monitor so
-- pg_stat_activity shows other roles' transactions (without it only this role's own are seen).
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON {schema}.{table}, {schema}.{bindings}, {schema}.{migrations} TO {role};
GRANT SELECT ON {schema}."delayq_beat_entries", {schema}."delayq_beat_installed" TO {role};
GRANT pg_monitor TO {role}

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

-- Statements of core/inspect.py (`delayq tasks`, `delayq web`): listing, one task, cancel,
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

-- Statements of the opt-in argument search index (core/search.py, `delayq tasks search-index`).
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

-- Statements of partitions that are kept, not consumed (Dramatiq's dead letters), and of
-- whole-partition inspection; used through delayq_transport.core.partitions.

-- dead_letter --
-- Move deliveries (matched on id and lock, as acks are) to another kind, where no consumer
-- polls: the row itself moves, so a dead letter is never a copy; a non-NULL payload replaces the
-- stored one (the failed message with its final options). It is kept until
-- scheduledAt = now + retention, then `expire_kinds` deletes it.
UPDATE {table} AS t
SET "pKind" = %(to_kind)s, "lockUuid" = NULL,
    "payload" = COALESCE((%(payloads)s::bytea[])[array_position(%(ids)s::bigint[], t."id")],
                         t."payload"),
    "scheduledAt" = {now} + %(retention_ms)s::bigint, "scheduledAtInitially" = {now}
WHERE t."id" = ANY(%(ids)s::bigint[]) AND t."lockUuid" = ANY(%(lock_set)s::text[])
  AND t."lockUuid" = (%(locks)s::text[])[array_position(%(ids)s::bigint[], t."id")]

-- expire_kinds --
-- Retention of kept partitions: delete their rows whose scheduledAt (end of retention) passed.
DELETE FROM {table}
WHERE "pKind" = ANY(%(kinds)s::text[]) AND "scheduledAt" <= {now} AND "lockUuid" IS NULL

-- count_all --
-- Every row of these kinds, in flight or not: a queue is "joined" when this reaches 0.
SELECT count(*) AS n FROM {table} WHERE "pKind" = ANY(%(kinds)s::text[])

-- list_kinds --
-- Rows of these kinds, most recent first (dead-letter listings).
SELECT "id", "pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "lockUuid", "createdAt"
FROM {table}
WHERE "pKind" = ANY(%(kinds)s::text[])
ORDER BY "scheduledAtInitially" DESC, "id" DESC
LIMIT %(limit)s

-- kinds_like --
-- Distinct kinds starting with a (LIKE-escaped) prefix: the queues an adapter has stored.
SELECT DISTINCT "pKind" FROM {table} WHERE "pKind" LIKE %(pattern)s ESCAPE '\'

-- Statements of the web page's dead letters and workers (core/leases.py, core/partitions.py).
-- Bounded like the rest of inspect: dead letters are read from the (pKind, scheduledAt) index
-- backwards, leases from the (lockUuid, id) index, each with a LIMIT inside the scan.

-- dead_letters_page --
-- Dead letters of these kinds, newest first, after the keyset cursor (scheduledAt, id). A dead
-- letter's scheduledAt is the end of its retention (dead_letter: failure time + retention), so
-- the index read backwards lists the latest failures first without sorting the kind.
WITH w AS (
    SELECT s.id, s.at
    FROM unnest(%(kinds)s::text[]) AS k(kind)
    CROSS JOIN LATERAL (
        SELECT "id", "scheduledAt" AS at FROM {table}
        WHERE "pKind" = k.kind AND "scheduledAt" <= %(before_at)s::bigint
          AND ("scheduledAt", "id") < (%(before_at)s::bigint, %(before_id)s::bigint)
        ORDER BY "scheduledAt" DESC, "id" DESC
        LIMIT %(limit)s
    ) AS s
    ORDER BY s.at DESC, s.id DESC
    LIMIT %(limit)s
)
SELECT t."id", t."pKey", t."pKind", t."payload", t."scheduledAt", t."scheduledAtInitially",
       t."lockUuid", t."createdAt", n.now
FROM w JOIN {table} AS t ON t."id" = w.id CROSS JOIN (SELECT {now} AS now) AS n
ORDER BY w.at DESC, w.id DESC

-- dead_letters_count --
-- Dead letters per kind, each count stopping at `cap` (the page shows "cap+").
SELECT k.kind, (SELECT count(*) FROM (SELECT 1 FROM {table} WHERE "pKind" = k.kind
                                      LIMIT %(cap)s) AS x) AS n
FROM unnest(%(kinds)s::text[]) AS k(kind)
ORDER BY k.kind

-- dead_letter_requeue --
-- Move one dead letter back to a consumed kind, due now, with the payload given (its retry
-- state reset); the update trigger wakes the consumers. Only from the dead-letter kind it was
-- read in: a second requeue, or one racing a delete, changes nothing.
UPDATE {table}
SET "pKind" = %(to_kind)s, "payload" = %(payload)s, "scheduledAt" = {now},
    "scheduledAtInitially" = {now}
WHERE "id" = %(id)s AND "pKind" = %(from_kind)s AND "lockUuid" IS NULL
RETURNING "id", "scheduledAt"

-- dead_letter_delete --
-- Delete dead letters by id, only from the dead-letter kinds given (never a live message).
DELETE FROM {table}
WHERE "id" = ANY(%(ids)s::bigint[]) AND "pKind" = ANY(%(kinds)s::text[]) AND "lockUuid" IS NULL
RETURNING "id"

-- leases_held --
-- What consumers hold: rows with a lock, per (lock, kind), read through the (lockUuid, id)
-- index and stopped at `cap` rows (leases are few: the workers' prefetch). A lock is one poll;
-- core/leases.py groups locks into worker processes by the tag that starts each lock id.
SELECT h."lockUuid", h."pKind", count(*) AS n, min(h."scheduledAt") AS lease_min,
       max(h."scheduledAt") AS lease_max, min(h."scheduledAtInitially") AS oldest_eta, n.now
FROM (SELECT "lockUuid", "pKind", "scheduledAt", "scheduledAtInitially" FROM {table}
      WHERE "lockUuid" IS NOT NULL ORDER BY "lockUuid", "id" LIMIT %(cap)s) AS h
CROSS JOIN (SELECT {now} AS now) AS n
GROUP BY h."lockUuid", h."pKind", n.now
ORDER BY h."lockUuid", h."pKind"

-- bindings_seen --
-- Queues consumers declared, with the last heartbeat of any consumer (bindings_touch) and
-- whether it is an auto-delete queue (a Celery worker's remote-control mailbox is one).
SELECT "queue", max("seenAt") AS seen_at, bool_or("autoDelete") AS auto_delete
FROM {bindings}
GROUP BY "queue"
ORDER BY "queue"
LIMIT %(limit)s

-- task_results_start --
-- A worker of Django's task framework begins an attempt (core/task_results.py): the task's
-- result row is created RUNNING, or marked RUNNING again with this worker appended, unless it is
-- final already (the outcome was recorded, then the worker died before its ack was flushed: the
-- redelivery is acked without running the task again). No row back: final already.
INSERT INTO "delayq_task_results" AS r
    ("tableName", "id", "task", "status", "enqueuedAt", "startedAt", "lastAttemptedAt",
     "errors", "workerIds", "updatedAt")
VALUES (%(table_name)s, %(id)s, %(task)s::jsonb, 'RUNNING', %(enqueued_at)s::bigint,
        %(at)s::bigint, %(at)s::bigint, '[]'::jsonb, jsonb_build_array(%(worker_id)s::text),
        %(at)s::bigint)
ON CONFLICT ("tableName", "id") DO UPDATE
SET "status" = 'RUNNING', "lastAttemptedAt" = EXCLUDED."lastAttemptedAt",
    "workerIds" = r."workerIds" || EXCLUDED."workerIds", "updatedAt" = EXCLUDED."updatedAt"
WHERE r."status" NOT IN ('SUCCESSFUL', 'FAILED')
RETURNING r."startedAt", r."workerIds", r."errors"

-- task_results_finish --
-- An attempt's outcome: SUCCESSFUL or FAILED with its finish time, or READY again while a retry
-- waits; its error (if any) appended, its return value (JSON) kept. Written before the queue
-- row's ack.
UPDATE "delayq_task_results"
SET "status" = %(status)s, "finishedAt" = %(finished_at)s::bigint,
    "returnValue" = %(return_value)s::jsonb, "errors" = "errors" || %(errors)s::jsonb,
    "updatedAt" = %(at)s::bigint
WHERE "tableName" = %(table_name)s AND "id" = %(id)s

-- task_results_get --
-- One task by key: its result row (none until a worker started it) and its queue row, waiting
-- or leased, among the kinds that start with `prefix` (found by the (pKey, pKind) index).
-- Always one row: both sides NULL means no such task.
SELECT r."task", r."status", r."enqueuedAt", r."startedAt", r."lastAttemptedAt",
       r."finishedAt", r."returnValue", r."errors", r."workerIds", q."payload", q."lockUuid"
FROM (SELECT 1) AS one
LEFT JOIN "delayq_task_results" AS r ON r."tableName" = %(table_name)s AND r."id" = %(id)s
LEFT JOIN LATERAL (
    SELECT "payload", "lockUuid" FROM {table}
    WHERE "pKey" = %(id)s AND starts_with("pKind", %(prefix)s)
    LIMIT 1
) AS q ON true

-- task_results_prune --
-- Results that finished before `before`, at most `limit` per statement (the caller repeats
-- while a batch was full), found by the (tableName, finishedAt) index.
DELETE FROM "delayq_task_results"
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM "delayq_task_results"
    WHERE "tableName" = %(table_name)s AND "finishedAt" < %(before)s::bigint
    LIMIT %(limit)s
))

-- task_kinds --
-- The kinds that hold rows and start with `prefix`, by a loose index scan of the (pKind,
-- scheduledAt) index: one descent per distinct kind of the table, whatever the rows per kind.
-- Every kind is walked (in the column's collation, where a prefix's kinds need not be
-- contiguous) and filtered after. A django.tasks worker polls only these (and the kinds its
-- wake-ups name) of its 201 priorities per queue.
WITH RECURSIVE k AS (
    (SELECT "pKind" AS kind FROM {table} ORDER BY "pKind" LIMIT 1)
    UNION ALL
    SELECT (SELECT "pKind" FROM {table} WHERE "pKind" > k.kind ORDER BY "pKind" LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)
SELECT kind FROM k WHERE kind IS NOT NULL AND starts_with(kind, %(prefix)s)
