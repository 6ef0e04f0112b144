-- The scheduling engine's tables (delayq_schedule_*) and CronService's occurrences.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- cron_keys_bytewise --
-- Whether the queue table's keys sort byte by byte: the C and POSIX collations, and libc's
-- C.UTF-8 (code point order, which is UTF-8's byte order). Then the keys that start with
-- `prefix/` are exactly those from `prefix/` up to `prefix0` ('0' follows '/'): one range of the
-- (pKey, pKind) index. In another collation (en_US, ICU) they need not be contiguous.
-- datlocprovider (PostgreSQL 15) read through to_jsonb: before 15 every database is libc's.
SELECT CASE WHEN c.collprovider = 'd'
            THEN COALESCE(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c'
                 AND d.datcollate ~ '^(C|POSIX)([.]|$)'
            ELSE c.collprovider = 'c' AND c.collcollate ~ '^(C|POSIX)([.]|$)' END
FROM pg_attribute AS a
JOIN pg_collation AS c ON c.oid = a.attcollation
JOIN pg_database AS d ON d.datname = current_database()
WHERE a.attrelid = {table_literal}::regclass AND a.attname = 'pKey'

-- cron_delete_other_configs --
-- installTick step 1: drop rows of this prefix that belong to any other config hash, found by
-- the key range [`lo`, `hi`) of the (pKey, pKind) index (cron_keys_bytewise says when that range
-- holds them all): a LIKE with a bound pattern serves no index, so the kind's index walked
-- every row of the kind (a million for a daily entry in a busy queue). The prefix's LIKE
-- stays, so a key outside the prefix is never deleted. Patterns are LIKE-escaped and end in
-- '/', so prefix `a` never matches `ab/...`.
DELETE FROM {table}
WHERE "pKey" >= %(lo)s AND "pKey" < %(hi)s AND "pKind" = %(kind)s
  AND "pKey" LIKE %(prefix_pattern)s ESCAPE '\'
  AND "pKey" NOT LIKE %(config_pattern)s ESCAPE '\'

-- cron_delete_other_configs_like --
-- cron_delete_other_configs where the keys do not sort byte by byte: through the kind's index.
DELETE FROM {table}
WHERE "pKind" = %(kind)s
  AND "pKey" LIKE %(prefix_pattern)s ESCAPE '\'
  AND "pKey" NOT LIKE %(config_pattern)s ESCAPE '\'

-- cron_uninstall --
-- uninstallTick: drop the rows of exactly this prefix and config hash.
DELETE FROM {table}
WHERE "pKind" = %(kind)s AND "pKey" LIKE %(config_pattern)s ESCAPE '\'

-- cron_switch --
-- An entry's configuration changed (its hash, or its queue kind): on one clock, in one
-- statement, its waiting rows of any other configuration (in `kinds`) due after now + min_lead
-- are deleted and the new configuration's occurrences after that same instant inserted. Rows
-- due sooner stay and run as installed (the new ones are never installed that close, so a
-- late installer cannot revive a fired tick): at every instant one configuration's
-- occurrence exists, none is lost at the switch and none doubled. The insert trigger sends
-- the wake-up. Returns the rows deleted and the keys created.
WITH n AS (SELECT {now} AS now),
gone AS (
    DELETE FROM {table} AS t USING n
    WHERE t."pKind" = ANY(%(kinds)s::text[]) AND t."pKey" LIKE %(prefix_pattern)s ESCAPE '\'
      AND NOT (t."pKind" = %(kind)s AND t."pKey" LIKE %(config_pattern)s ESCAPE '\')
      AND t."lockUuid" IS NULL AND t."scheduledAtInitially" > n.now + %(min_lead_ms)s::bigint
    RETURNING t."id"
), ins AS (
    INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially",
                         "createdAt")
    SELECT s.key, %(kind)s::text, s.payload, s.at, s.at, n.now
    FROM n, unnest(%(keys)b::text[], %(payloads)b::bytea[], %(ats)b::bigint[])
         AS s(key, payload, at)
    WHERE s.at > n.now + %(min_lead_ms)s::bigint
    ON CONFLICT ("pKey", "pKind") DO NOTHING
    RETURNING "pKey"
)
SELECT (SELECT count(*) FROM gone) AS deleted, ARRAY(SELECT "pKey" FROM ins) AS created

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

-- schedule_entry_upsert --
-- Add or replace a DB-backed beat entry (definition = task, schedule, args, kwargs, options).
INSERT INTO "delayq_schedule_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
VALUES (%(table_name)s, %(name)s, %(definition)s::jsonb, %(enabled)s, {now})
ON CONFLICT ("tableName", "name") DO UPDATE
SET "definition" = EXCLUDED."definition", "enabled" = EXCLUDED."enabled",
    "updatedAt" = EXCLUDED."updatedAt"

-- schedule_entry_set_enabled --
-- Enable/disable an entry; for a beat_schedule entry this stores an override row (no definition).
INSERT INTO "delayq_schedule_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
VALUES (%(table_name)s, %(name)s, NULL, %(enabled)s, {now})
ON CONFLICT ("tableName", "name") DO UPDATE
SET "enabled" = EXCLUDED."enabled", "updatedAt" = EXCLUDED."updatedAt"
RETURNING "definition" IS NOT NULL AS has_definition

-- schedule_entries_upsert_many --
-- `delayq beat import`: add or replace many DB-backed entries in one statement, all or none.
INSERT INTO "delayq_schedule_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
SELECT %(table_name)s, e.name, e.definition::jsonb, e.enabled, {now}
FROM unnest(%(names)s::text[], %(definitions)s::text[], %(enableds)s::boolean[])
     AS e(name, definition, enabled)
ON CONFLICT ("tableName", "name") DO UPDATE
SET "definition" = EXCLUDED."definition", "enabled" = EXCLUDED."enabled",
    "updatedAt" = EXCLUDED."updatedAt"

-- schedule_entries_delete_many --
-- `delayq beat import --undo`: remove the entries an import added; returns the names removed.
DELETE FROM "delayq_schedule_entries"
WHERE "tableName" = %(table_name)s AND "name" = ANY(%(names)s::text[])
RETURNING "name"

-- schedule_entry_delete --
-- Remove a DB-backed entry (or an enable/disable override).
DELETE FROM "delayq_schedule_entries" WHERE "tableName" = %(table_name)s AND "name" = %(name)s

-- schedule_entries_list --
-- Every DB-backed entry and override of one queue table.
SELECT "name", "definition", "enabled", "updatedAt"
FROM "delayq_schedule_entries" WHERE "tableName" = %(table_name)s ORDER BY "name"

-- schedule_installed_list --
-- The ledger: which entries have occurrences installed, in which kind, under which config hash,
-- and since when (firstInstalledAt: recorded only for entries that need it, see below).
SELECT "name", "kind", "configHash", "installedUntil", "updatedAt", "firstInstalledAt"
FROM "delayq_schedule_installed" WHERE "tableName" = %(table_name)s ORDER BY "name"

-- schedule_first_install --
-- The first install of an entry's configuration, claimed once: the first scheduler to install
-- it under this config hash records the database clock (and installedUntil: nothing before it is
-- owed); every other one, at the same time or later, reads that time back. A changed hash starts
-- afresh. `inserted` tells the one scheduler whose claim it was (a one-off already due runs once).
INSERT INTO "delayq_schedule_installed" AS i
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

-- schedule_tables_in_use --
-- Whether any beat entry or installed ledger row exists for one queue table: ``delayq status``
-- loads the beat plugin (and Celery) only then.
SELECT EXISTS (SELECT 1 FROM "delayq_schedule_entries" WHERE "tableName" = %(table_name)s)
    OR EXISTS (SELECT 1 FROM "delayq_schedule_installed" WHERE "tableName" = %(table_name)s)

-- schedule_installed_upsert --
-- Record installs of many entries at once. installedUntil only grows for an unchanged config,
-- so a beat with a stale view never makes another one re-offer its whole horizon.
INSERT INTO "delayq_schedule_installed" AS i
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

-- schedule_installed_delete --
-- Forget entries whose occurrences were uninstalled (removed, disabled or renamed).
DELETE FROM "delayq_schedule_installed"
WHERE "tableName" = %(table_name)s AND "name" = ANY(%(names)s::text[])

-- schedule_misfire_sweep --
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

-- schedule_newer_due --
-- Worker side of `coalesce`: is a newer occurrence of the same entry and config already due?
SELECT EXISTS (
    SELECT 1 FROM {table}
    WHERE "pKind" = %(kind)s AND "scheduledAt" > %(at_ms)s
      AND "scheduledAtInitially" > %(at_ms)s AND "scheduledAtInitially" <= {now}
      AND "pKey" LIKE %(pattern)s ESCAPE '\'
) AS newer

-- schedule_catch_up --
-- A refresh after no scheduler ran past the end of an entry's installed horizon: insert the
-- runs the misfire policy keeps of the occurrences never installed (due at once: scheduledAt
-- is now, scheduledAtInitially the occurrence), and the new horizon, only if this statement
-- moves the entry's ledger row on from the installedUntil this refresh read. A scheduler that
-- read the same row waits on its lock, finds it moved and inserts nothing, so a gap is caught
-- up once however many schedulers restart together; the runs skip min_lead (they are due
-- already) without a later scheduler reviving them. Horizon rows (after `gap_end`) keep
-- offer_batch_insert's min_lead. `claimed` is 0 when another scheduler took the gap.
WITH claim AS (
    UPDATE "delayq_schedule_installed"
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

-- schedule_scheduler_heartbeat --
-- Where every refresh of a scheduler starts (scheduling/authority.py): it records itself (its
-- configuration; when any scheduler of this ledger first ran that configuration; a heartbeat
-- alive until now + `alive_ms`) and reads which configuration is in force: of the
-- configurations of the schedulers alive, itself included, the one with valid entries (a
-- count) first seen last (ties: the greater hash). Its row keeps the one it found (`follows`); the schedulers of
-- that configuration act only once every scheduler alive follows it (`lagging` is empty), so a
-- refresh another configuration began before the switch has ended by then. Rows lapsed
-- longer than `keep_ms` go (until then they remember when their configuration was first seen).
-- Returns the clock the refresh uses as now.
WITH n AS (SELECT {now} AS now),
since AS (
    SELECT COALESCE(min(s."configSince"), min(n.now)) AS at
    FROM n LEFT JOIN "delayq_schedule_schedulers" AS s
      ON s."tableName" = %(table_name)s AND s."configHash" = %(hash)s
     AND (s."schedulerId" = %(scheduler)s OR s."aliveUntil" >= n.now - %(keep_ms)s::bigint)
),
alive AS (
    SELECT s."configHash", s."configSince", s."entries", s."follows", s."process"
    FROM "delayq_schedule_schedulers" AS s, n
    WHERE s."tableName" = %(table_name)s AND s."schedulerId" <> %(scheduler)s
      AND s."aliveUntil" > n.now
),
winner AS (
    SELECT c.hash, c.since FROM (
        SELECT a."configHash" AS hash, a."configSince" AS since, a."entries" FROM alive AS a
        UNION ALL
        SELECT %(hash)s, since.at, %(entries)s::integer FROM since
    ) AS c
    ORDER BY c."entries" > 0 DESC, c.since DESC, c.hash DESC
    LIMIT 1
),
pruned AS (
    DELETE FROM "delayq_schedule_schedulers" AS s USING n
    WHERE s."tableName" = %(table_name)s AND s."schedulerId" <> %(scheduler)s
      AND s."aliveUntil" < n.now - %(keep_ms)s::bigint
),
me AS (
    INSERT INTO "delayq_schedule_schedulers" AS s
        ("tableName", "schedulerId", "process", "configHash", "configSince", "entries",
         "follows", "seenAt", "aliveUntil")
    SELECT %(table_name)s, %(scheduler)s, %(process)s, %(hash)s, since.at, %(entries)s,
           winner.hash, n.now, n.now + %(alive_ms)s::bigint
    FROM n, since, winner
    ON CONFLICT ("tableName", "schedulerId") DO UPDATE
    SET "process" = EXCLUDED."process", "configHash" = EXCLUDED."configHash",
        "configSince" = EXCLUDED."configSince", "entries" = EXCLUDED."entries",
        "follows" = EXCLUDED."follows", "seenAt" = EXCLUDED."seenAt",
        "aliveUntil" = EXCLUDED."aliveUntil"
)
SELECT n.now, winner.hash, winner.since, since.at,
       ARRAY(SELECT a."process" || ' (' || a."configHash" || ')' FROM alive AS a
             WHERE a."follows" <> winner.hash ORDER BY 1) AS lagging,
       (SELECT count(*) FROM alive) AS others
FROM n, winner, since

-- schedule_scheduler_renew --
-- A refresh that takes long keeps its scheduler alive between its writes, if it still is (a
-- lapsed one may have been replaced meanwhile: no row, and the refresh stops writing).
UPDATE "delayq_schedule_schedulers" SET "aliveUntil" = {now} + %(alive_ms)s::bigint
WHERE "tableName" = %(table_name)s AND "schedulerId" = %(scheduler)s AND "aliveUntil" > {now}
RETURNING "aliveUntil"

-- schedule_scheduler_retire --
-- A scheduler that stops: its heartbeat lapses now, so no other waits for it; the row stays
-- (it remembers when its configuration was first seen) until the heartbeat's `keep_ms`.
UPDATE "delayq_schedule_schedulers" SET "aliveUntil" = {now}
WHERE "tableName" = %(table_name)s AND "schedulerId" = %(scheduler)s
