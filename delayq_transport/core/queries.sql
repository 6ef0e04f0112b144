-- Every statement delayq sends to PostgreSQL, one named block per operation of
-- shared/design/internals.md. Blocks start with `-- name --`, then a one-line comment.
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
-- Phase 1 of offer(): optimistic insert; 0 rows means the key exists.
INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
VALUES (%(key)s, %(kind)s, %(payload)s,
        COALESCE(%(scheduled_at)s::bigint, {now}), COALESCE(%(scheduled_at)s::bigint, {now}), {now})
ON CONFLICT ("pKey", "pKind") DO NOTHING

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

-- offer_batch_insert --
-- offer_batch(): one multi-row insert from arrays (sent in binary: text-format arrays of bytea
-- cost more to escape than the insert itself); RETURNING names the keys that were created,
-- every other key already existed (or repeats within the batch). Rows closer to now than
-- `min_lead_ms` are not inserted (CronService: a late installer must not revive a fired tick).
INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
SELECT s.key, s.kind, s.payload, COALESCE(s.at, {now}), COALESCE(s.at, {now}), {now}
FROM unnest(%(keys)b::text[], %(kinds)b::text[], %(payloads)b::bytea[], %(ats)b::bigint[])
     AS s(key, kind, payload, at)
WHERE %(min_lead_ms)s::bigint IS NULL OR COALESCE(s.at, {now}) > {now} + %(min_lead_ms)s::bigint
ON CONFLICT ("pKey", "pKind") DO NOTHING
RETURNING "pKey", "pKind"

-- try_poll_many --
-- Acquire up to `limit` due rows in one statement. Kinds are tried in the order given
-- (priority buckets); the outer LIMIT stops the lateral scan as soon as enough rows are locked.
-- The lease is the new scheduledAt; previous_at tells a redelivery from a first delivery.
-- A last row (id NULL) carries the earliest scheduledAt left over these kinds (leases included),
-- so a consumer learns when to wake next without a second round trip. The update finds its rows
-- by `id = ANY(array)`, an index lookup whatever LIMIT is estimated at: the consumer pool runs
-- generic plans, and a join on `picked` there became a sequential scan on larger tables.
WITH picked AS (
    SELECT q.id, q."scheduledAt" AS previous_at, k.ord
    FROM unnest(%(kinds)s::text[]) WITH ORDINALITY AS k(kind, ord)
    CROSS JOIN LATERAL (
        SELECT "id", "scheduledAt"
        FROM {table}
        WHERE "pKind" = k.kind AND "scheduledAt" <= {now}
        ORDER BY "scheduledAt"
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS q
    LIMIT %(limit)s
),
acquired AS (
    UPDATE {table} AS t
    SET "lockUuid" = %(lock)s, "scheduledAt" = {now} + %(lease_ms)s::bigint
    WHERE t."id" = ANY(ARRAY(SELECT id FROM picked))
    RETURNING t."id", t."pKey", t."pKind", t."payload", t."scheduledAtInitially", t."createdAt"
)
SELECT a."id", a."pKey", a."pKind", a."payload", p.previous_at, a."scheduledAtInitially",
       a."createdAt", p.ord, NULL::bigint AS next_due
FROM acquired AS a JOIN picked AS p ON p.id = a."id"
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, (
    SELECT min(x.at)
    FROM unnest(%(kinds)s::text[]) AS k(kind)
    CROSS JOIN LATERAL (
        SELECT "scheduledAt" AS at FROM {table}
        WHERE "pKind" = k.kind AND "id" NOT IN (SELECT id FROM picked)
        ORDER BY "scheduledAt" LIMIT 1
    ) AS x
)

-- ack --
-- Delete one delivery; a row re-acquired or replaced since then carries another lock and stays.
DELETE FROM {table} WHERE "id" = %(id)s AND "lockUuid" = %(lock)s

-- ack_many --
-- Delete many deliveries in one statement, each matched on its own (id, lock) pair.
DELETE FROM {table} AS t
USING unnest(%(ids)b::bigint[], %(locks)b::text[]) AS a(id, lock)
WHERE t."id" = a.id AND t."lockUuid" = a.lock

-- ack_lock --
-- Delete every row acquired under one lock (internals.md's acknowledge of a whole poll).
DELETE FROM {table} WHERE "lockUuid" = %(lock)s

-- extend_lease --
-- Push the lease of rows a live consumer still holds, so they are not redelivered.
UPDATE {table} SET "scheduledAt" = {now} + %(lease_ms)s::bigint
WHERE "lockUuid" = ANY(%(locks)s::text[])

-- release --
-- Un-acquire deliveries in place (reject/requeue, closing channel): no copy is made. The row
-- becomes due after `delay_ms` and reads as a redelivery.
UPDATE {table} AS t
SET "lockUuid" = NULL,
    "scheduledAt" = GREATEST({now} + %(delay_ms)s::bigint, t."scheduledAtInitially" + 1)
FROM unnest(%(ids)s::bigint[], %(locks)s::text[]) AS a(id, lock)
WHERE t."id" = a.id AND t."lockUuid" = a.lock

-- get --
-- Read one row by key.
SELECT "id", "pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "lockUuid", "createdAt"
FROM {table}
WHERE "pKey" = %(key)s AND "pKind" = %(kind)s

-- delete --
-- Delete one row by key, whatever its state.
DELETE FROM {table} WHERE "pKey" = %(key)s AND "pKind" = %(kind)s

-- delete_waiting_by_keys --
-- Delete rows with these keys in any kind that no consumer holds (revoking scheduled tasks).
DELETE FROM {table} WHERE "pKey" = ANY(%(keys)s::text[]) AND "lockUuid" IS NULL
RETURNING "pKey", "pKind"

-- purge --
-- Drop every waiting row (due or scheduled) of these kinds; rows in flight stay.
DELETE FROM {table} WHERE "pKind" = ANY(%(kinds)s::text[]) AND "lockUuid" IS NULL

-- count_waiting --
-- Rows of these kinds that are not in flight: kombu's queue size.
SELECT count(*) AS n FROM {table} WHERE "pKind" = ANY(%(kinds)s::text[]) AND "lockUuid" IS NULL

-- next_due --
-- Earliest scheduledAt over these kinds, leases included (an expiring lease is a redelivery).
SELECT min(x.at) AS at
FROM unnest(%(kinds)s::text[]) AS k(kind)
CROSS JOIN LATERAL (
    SELECT "scheduledAt" AS at FROM {table} WHERE "pKind" = k.kind ORDER BY "scheduledAt" LIMIT 1
) AS x

-- status --
-- Per-kind counters for `delayq status`. A row whose lease ran out counts as due and redelivered.
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

-- migrations_ensure --
-- The ledger of applied schema versions, one row per (table, version).
CREATE TABLE IF NOT EXISTS {migrations} (
    "tableName" TEXT NOT NULL,
    "version" INTEGER NOT NULL,
    "appliedAt" TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY ("tableName", "version")
)

-- migrations_lock --
-- Serialise concurrent migrators (several workers starting at once) on one advisory lock.
SELECT pg_advisory_xact_lock(%(lock_key)s)

-- migrations_applied --
-- Versions already applied to this table.
SELECT "version" FROM {migrations} WHERE "tableName" = %(table_name)s

-- migrations_record --
-- Remember that a version was applied.
INSERT INTO {migrations} ("tableName", "version") VALUES (%(table_name)s, %(version)s)
ON CONFLICT DO NOTHING

-- table_persistence --
-- 'p' (logged) or 'u' (unlogged) for the queue table: the opt-in unlogged mode (issue 11).
SELECT c.relpersistence FROM pg_class AS c WHERE c.oid = {table_regclass}::regclass

-- table_set_unlogged --
-- Opt-in: no WAL for the queue table; a PostgreSQL crash empties it (see docs/transport.md).
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

-- listen --
-- Subscribe a connection to this table's wake-ups.
LISTEN {channel}

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

-- scan_page --
-- One page of rows with lo <= id < hi, in id order (keyset paging inside a Spark partition).
-- in_flight / redelivered follow the `status` block: an expired lease is due and redelivered.
SELECT t."id", t."pKey", t."pKind", t."payload", t."scheduledAt", t."scheduledAtInitially",
       t."createdAt",
       t."lockUuid" IS NOT NULL AND t."scheduledAt" > n.now AS in_flight,
       t."scheduledAt" > t."scheduledAtInitially"
           AND (t."lockUuid" IS NULL OR t."scheduledAt" <= n.now) AS redelivered
FROM {table} AS t, (SELECT {now} AS now) AS n
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

-- beat_entry_delete --
-- Remove a DB-backed entry (or an enable/disable override).
DELETE FROM "delayq_beat_entries" WHERE "tableName" = %(table_name)s AND "name" = %(name)s

-- beat_entries_list --
-- Every DB-backed entry and override of one queue table.
SELECT "name", "definition", "enabled", "updatedAt"
FROM "delayq_beat_entries" WHERE "tableName" = %(table_name)s ORDER BY "name"

-- beat_installed_list --
-- The ledger: which entries have occurrences installed, in which kind, under which config hash.
SELECT "name", "kind", "configHash", "installedUntil", "updatedAt"
FROM "delayq_beat_installed" WHERE "tableName" = %(table_name)s ORDER BY "name"

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

-- Statements of the demo (`delayq demo`): its Celery app logs each run of its tasks so the
-- live view can show scheduled -> running -> done. Not part of the queue.

-- runlog_reset --
-- Start the demo's run log afresh.
DROP TABLE IF EXISTS delayq_demo_runs;
CREATE TABLE delayq_demo_runs (
    task_id TEXT NOT NULL, attempt INT NOT NULL, state TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (task_id, attempt, state))

-- runlog_record --
-- One step of one run of a demo task (running, retrying, done).
INSERT INTO delayq_demo_runs (task_id, attempt, state) VALUES (%(task_id)s, %(attempt)s, %(state)s)
ON CONFLICT DO NOTHING

-- runlog_list --
-- Every step so far, oldest first (the view keeps each task's latest).
SELECT task_id, state, at FROM delayq_demo_runs ORDER BY at
