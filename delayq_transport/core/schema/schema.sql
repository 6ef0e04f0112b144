-- Schema work: the migrations' ledger and lock, the DDL of numbered migrations, grants, uninstall.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

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
-- it never runs DDL (core/schema/migrations.py, require_schema).
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

-- schedule_ledger_grantees --
-- Roles (not PUBLIC, not the owner) granted on the scheduling ledger, and whether they may
-- write it (they run schedulers) or only read it: migration 18 gives them the same on the
-- schedulers' heartbeats, so roles granted before it keep working (least privilege kept).
SELECT r.rolname, bool_or(a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE')) AS writes
FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
JOIN pg_roles AS r ON r.oid = a.grantee
WHERE c.oid = to_regclass('"delayq_schedule_installed"') AND a.grantee <> c.relowner
GROUP BY r.rolname
ORDER BY 1

-- table_readers_and_pollers --
-- Roles (not PUBLIC, not the owner) that poll the queue table (UPDATE) or only read it (SELECT,
-- no INSERT: a monitor), and which: migration 21 gives pollers what the claim of a controlled
-- queue needs and readers what `delayq status` and the metrics read, as `delayq grants` does,
-- so roles granted before it keep working. Producers (INSERT, no UPDATE) get nothing.
SELECT r.rolname, bool_or(a.privilege_type = 'UPDATE') AS polls
FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
JOIN pg_roles AS r ON r.oid = a.grantee
WHERE c.oid = {table_literal}::regclass AND a.grantee <> c.relowner
GROUP BY r.rolname
HAVING bool_or(a.privilege_type = 'UPDATE')
    OR (bool_or(a.privilege_type = 'SELECT') AND NOT bool_or(a.privilege_type = 'INSERT'))
ORDER BY 1

-- controls_claim_function --
-- Migration 21: the claim of a controlled queue (core/queue/controls.py: `claim_controlled`
-- calls it once per poll; queues without a control row never do). A function, not one
-- statement, because the limits must be counted after the control row's lock is granted: in
-- READ COMMITTED a statement keeps the snapshot it started with, so two workers racing would
-- each count the slots as they were before the other's claim; a VOLATILE function takes a new
-- snapshot for each statement after the lock. Claims of one controlled queue are thereby
-- serialised across the fleet, which is what holding a limit costs.
-- Paused: nothing is claimed, and no due time (resuming NOTIFYs). Concurrency: the slots of
-- rows held under a live lease (control_slots, one per claimed row), swept here once their row
-- is acked, released or its lease lapsed, so a killed worker's slot comes back with its lease.
-- Rate: a token bucket in the control row (per key: in control_keys), refilled by the time
-- elapsed and holding at most `p_burst_ms` of tokens (at least one). Per key: a row's key is
-- its payload's JSON at the path given for its kind (NULL: the row has no key and only the
-- queue's limits apply); keyed limits look at the first `p_key_window` due rows, so a key at
-- its limit does not hold back the others behind it. Rows held back are left untouched: due,
-- unleased, in place. The last row (id NULL) carries when to look again (a token or a slot
-- expected, or the next due time) and the claim's now, as try_poll_many's does.
CREATE OR REPLACE FUNCTION {claim_fn}(
    p_name text, p_kinds text[], p_key_paths text[], p_limit integer, p_lock text,
    p_lease_ms bigint, p_now bigint, p_want_next boolean, p_retry_ms bigint,
    p_key_window integer, p_burst_ms bigint)
RETURNS TABLE (id bigint, "pKey" text, "pKind" text, payload bytea, previous_at bigint,
               "scheduledAtInitially" bigint, "createdAt" bigint, ord bigint,
               next_due bigint, polled_at bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
#variable_conflict use_column
DECLARE
    c {controls}%ROWTYPE;
    v_now bigint;
    v_room integer := p_limit;
    v_tokens double precision;
    v_key_burst double precision;
    v_keyed boolean;
    v_slots boolean;
    v_window integer;
    v_ids bigint[]; v_tids tid[]; v_prev bigint[]; v_ords bigint[]; v_keys text[];
    c_ids bigint[]; c_tids tid[]; c_prev bigint[]; c_ords bigint[]; c_keys text[];
    c_rns bigint[];
    v_seen bigint := 0;
    v_taken integer := 0;
    v_next bigint;
BEGIN
    SELECT x.* INTO c FROM {controls} AS x WHERE x."name" = p_name FOR UPDATE;
    v_now := COALESCE(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    IF c."paused" THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint,
            NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, v_now;
        RETURN;
    END IF;
    v_keyed := c."keyConcurrency" IS NOT NULL OR c."keyRateCount" IS NOT NULL;
    v_slots := c."concurrency" IS NOT NULL OR c."keyConcurrency" IS NOT NULL;
    v_key_burst := GREATEST(1.0, c."keyRateCount"::float8 * p_burst_ms / c."keyRateMs");
    IF v_slots THEN
        DELETE FROM {control_slots} AS s
        WHERE s."name" = p_name AND NOT EXISTS (
            SELECT 1 FROM {table} AS t
            WHERE t."id" = s."id" AND t."lockUuid" = s."lock" AND t."scheduledAt" > v_now);
    END IF;
    IF c."concurrency" IS NOT NULL THEN
        v_room := LEAST(v_room, c."concurrency" - (
            SELECT count(*) FROM {control_slots} AS s WHERE s."name" = p_name)::integer);
    END IF;
    IF c."rateCount" IS NOT NULL THEN
        v_tokens := LEAST(GREATEST(1.0, c."rateCount"::float8 * p_burst_ms / c."rateMs"),
                          c."tokens" + GREATEST(v_now - c."refilledAt", 0)::float8
                                       * c."rateCount" / c."rateMs");
        v_room := LEAST(v_room, floor(v_tokens)::integer);
    END IF;
    IF v_room > 0 THEN
        v_window := CASE WHEN v_keyed THEN GREATEST(v_room, p_key_window) ELSE v_room END;
        -- The window of due rows, locked (others' locked rows skipped), each with its key and
        -- its place among its key's rows.
        SELECT array_agg(w.id), array_agg(w.tid), array_agg(w.at), array_agg(w.ord),
               array_agg(w.key), array_agg(w.rn)
        INTO c_ids, c_tids, c_prev, c_ords, c_keys, c_rns
        FROM (
            SELECT cand.*, row_number() OVER (PARTITION BY cand.key
                                              ORDER BY cand.ord, cand.at, cand.id) AS rn
            FROM (
                SELECT q."id" AS id, q.ctid AS tid, q."scheduledAt" AS at, k.ord,
                       CASE WHEN v_keyed AND k.path IS NOT NULL
                                 AND substring(q."payload" FROM 1 FOR 1) = '\x7b'::bytea
                            THEN convert_from(q."payload", 'UTF8')::jsonb
                                 #>> string_to_array(k.path, '.') END AS key
                FROM unnest(p_kinds, p_key_paths) WITH ORDINALITY AS k(kind, path, ord)
                CROSS JOIN LATERAL (
                    SELECT t."id", t.ctid, t."scheduledAt", t."payload" FROM {table} AS t
                    WHERE (t."pKind", t."scheduledAt") >= (k.kind, -9223372036854775808)
                      AND t."pKind" = k.kind AND t."scheduledAt" <= v_now
                    ORDER BY t."pKind", t."scheduledAt"
                    LIMIT v_window
                    FOR UPDATE SKIP LOCKED
                ) AS q
                LIMIT v_window
            ) AS cand
        ) AS w;
        v_seen := COALESCE(cardinality(c_ids), 0);
        -- Of the window, the rows whose key has room, up to the queue's room.
        SELECT array_agg(w.id), array_agg(w.tid), array_agg(w.at), array_agg(w.ord),
               array_agg(w.key)
        INTO v_ids, v_tids, v_prev, v_ords, v_keys
        FROM (
            SELECT w.*
            FROM unnest(c_ids, c_tids, c_prev, c_ords, c_keys, c_rns)
                 AS w(id, tid, at, ord, key, rn)
            LEFT JOIN (SELECT s."key", count(*) AS n FROM {control_slots} AS s
                       WHERE s."name" = p_name AND s."key" IS NOT NULL
                       GROUP BY s."key") AS u ON u."key" = w.key
            LEFT JOIN {control_keys} AS b ON b."name" = p_name AND b."key" = w.key
            WHERE w.key IS NULL
               OR ((c."keyConcurrency" IS NULL OR COALESCE(u.n, 0) + w.rn <= c."keyConcurrency")
                   AND (c."keyRateCount" IS NULL OR w.rn <= floor(LEAST(v_key_burst,
                        COALESCE(b."tokens", v_key_burst)
                        + GREATEST(v_now - b."refilledAt", 0)::float8
                          * c."keyRateCount" / c."keyRateMs"))))
            ORDER BY w.ord, w.at, w.id
            LIMIT v_room
        ) AS w;
        v_taken := COALESCE(cardinality(v_ids), 0);
    END IF;
    IF v_taken > 0 THEN
        RETURN QUERY
        WITH acquired AS (
            UPDATE {table} AS t SET "lockUuid" = p_lock, "scheduledAt" = v_now + p_lease_ms
            WHERE t.ctid = ANY(v_tids) AND t."id" = ANY(v_ids)
            RETURNING t."id", t."pKey", t."pKind", t."payload", t."scheduledAtInitially",
                      t."createdAt"
        )
        SELECT a."id", a."pKey"::text, a."pKind"::text, a."payload", p.prev,
               a."scheduledAtInitially", a."createdAt", p.ord, NULL::bigint, NULL::bigint
        FROM acquired AS a JOIN unnest(v_ids, v_prev, v_ords) AS p(id, prev, ord)
          ON p.id = a."id";
        IF v_slots THEN
            INSERT INTO {control_slots} ("id", "lock", "name", "key")
            SELECT s.id, p_lock, p_name, s.key FROM unnest(v_ids, v_keys) AS s(id, key)
            ON CONFLICT ("id") DO UPDATE
            SET "lock" = EXCLUDED."lock", "name" = EXCLUDED."name", "key" = EXCLUDED."key";
        END IF;
        IF c."keyRateCount" IS NOT NULL THEN
            INSERT INTO {control_keys} AS b ("name", "key", "tokens", "refilledAt")
            SELECT p_name, s.key, v_key_burst - count(*), v_now
            FROM unnest(v_keys) AS s(key) WHERE s.key IS NOT NULL GROUP BY s.key
            ON CONFLICT ("name", "key") DO UPDATE
            SET "tokens" = LEAST(v_key_burst, b."tokens" + GREATEST(v_now - b."refilledAt", 0)::float8
                                 * c."keyRateCount" / c."keyRateMs")
                           - (v_key_burst - EXCLUDED."tokens"),
                "refilledAt" = v_now;
            -- Buckets full again are forgotten (a key not seen for a while starts full).
            DELETE FROM {control_keys} AS b
            WHERE b."name" = p_name
              AND b."refilledAt" < v_now - ceil(v_key_burst * c."keyRateMs" / c."keyRateCount");
        END IF;
    END IF;
    IF c."rateCount" IS NOT NULL THEN
        UPDATE {controls} AS x SET "tokens" = v_tokens - v_taken, "refilledAt" = v_now
        WHERE x."name" = p_name;
    END IF;
    IF v_taken < p_limit AND (v_room <= 0 OR v_seen > v_taken OR v_taken >= v_room) THEN
        -- A limit held due rows back: look again when a token comes, else after p_retry_ms.
        v_next := v_now + CASE
            WHEN c."rateCount" IS NOT NULL AND v_tokens - v_taken < 1 AND NOT v_seen > v_taken
            THEN GREATEST(1, ceil((1 - (v_tokens - v_taken)) * c."rateMs" / c."rateCount"))::bigint
            ELSE p_retry_ms END;
    ELSIF p_want_next THEN
        SELECT min(x.at) INTO v_next
        FROM unnest(p_kinds) AS k(kind)
        CROSS JOIN LATERAL (
            SELECT t."scheduledAt" AS at FROM {table} AS t
            WHERE (t."pKind", t."scheduledAt") >= (k.kind, -9223372036854775808)
              AND (t."pKind", t."scheduledAt") <= (k.kind, 9223372036854775807::bigint)
              AND t."id" <> ALL(COALESCE(v_ids, ARRAY[]::bigint[]))
            ORDER BY t."pKind", t."scheduledAt" LIMIT 1
        ) AS x;
    END IF;
    RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::bytea, NULL::bigint,
        NULL::bigint, NULL::bigint, NULL::bigint, v_next, v_now;
END
$fn$

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
-- from the marker on (core/queue/announce.py, core/queue/watermark.py). The version of migration 2
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
-- statement_timestamp, which no other statement of the transaction shares; core/queue/announce.py
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

-- beat_ledger_first_install_column --
-- Migration 12: the ledger records when each entry's configuration was first installed.
ALTER TABLE "delayq_beat_installed" ADD COLUMN IF NOT EXISTS "firstInstalledAt" BIGINT

-- schedule_tables_present --
-- Migration 16: whether the scheduling engine's tables exist under their old names (migration
-- 10) and under their new ones.
SELECT to_regclass('"delayq_beat_entries"') IS NOT NULL
       AND to_regclass('"delayq_beat_installed"') IS NOT NULL AS old,
       to_regclass('"delayq_schedule_entries"') IS NOT NULL
       AND to_regclass('"delayq_schedule_installed"') IS NOT NULL AS new

-- schedule_tables_rename --
-- Migration 16: the scheduling engine's tables, shared by Celery beat and Dramatiq's periodic
-- actors, named for what they are; their primary keys (and so their indexes) with them.
ALTER TABLE "delayq_beat_entries" RENAME TO "delayq_schedule_entries";
ALTER TABLE "delayq_schedule_entries"
    RENAME CONSTRAINT "delayq_beat_entries_pkey" TO "delayq_schedule_entries_pkey";
ALTER TABLE "delayq_beat_installed" RENAME TO "delayq_schedule_installed";
ALTER TABLE "delayq_schedule_installed"
    RENAME CONSTRAINT "delayq_beat_installed_pkey" TO "delayq_schedule_installed_pkey"

-- schedule_tables_merge --
-- Migration 16 when both names exist (migration 10 of a queue table migrated after the rename
-- created the old ones again): their rows go into the renamed tables, whose own rows win, and
-- the old tables are dropped.
INSERT INTO "delayq_schedule_entries" ("tableName", "name", "definition", "enabled", "updatedAt")
SELECT "tableName", "name", "definition", "enabled", "updatedAt" FROM "delayq_beat_entries"
ON CONFLICT DO NOTHING;
INSERT INTO "delayq_schedule_installed" ("tableName", "name", "kind", "configHash",
                                         "installedUntil", "updatedAt", "firstInstalledAt")
SELECT "tableName", "name", "kind", "configHash", "installedUntil", "updatedAt",
       "firstInstalledAt"
FROM "delayq_beat_installed"
ON CONFLICT DO NOTHING;
DROP TABLE "delayq_beat_entries", "delayq_beat_installed"

-- Statements of `delayq uninstall` (core/schema/uninstall.py): it lists, then drops, only what delayq
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
    to_regprocedure({search_fn_literal} || '(bytea)'),
    to_regprocedure({claim_fn_literal} || '(text, text[], text[], integer, text, bigint, bigint, '
                    || 'boolean, bigint, integer, bigint)')]) AS f
WHERE f IS NOT NULL

-- uninstall_other_tables --
-- Queue tables other than this one that the ledger records: the shared tables stay for them.
SELECT DISTINCT "tableName" FROM {migrations} WHERE "tableName" <> %(table_name)s ORDER BY 1

-- uninstall_drop_tables --
-- The queue table (its indexes, triggers and id sequence go with it), bindings and run ledger.
-- No CASCADE: a view or foreign key of the user's on them makes this fail, and nothing drops.
DROP TABLE IF EXISTS {table}, {bindings}, {runs}, {controls}, {control_slots}, {control_keys}

-- uninstall_drop_demo_log --
-- The run log `delayq demo` created next to its table (dropped only when it carries the mark).
DROP TABLE IF EXISTS {demo_log}

-- uninstall_drop_functions --
-- The table's functions, once nothing depends on them.
DROP FUNCTION IF EXISTS {notify_fn}(), {revoke_fn}(text[]), {search_fn}(bytea),
    {claim_fn}(text, text[], text[], integer, text, bigint, bigint, boolean, bigint, integer, bigint)

-- uninstall_forget_ledger --
-- The table's rows in the migrations ledger.
DELETE FROM {migrations} WHERE "tableName" = %(table_name)s

-- uninstall_forget_schedule --
-- The table's rows in the scheduling engine's tables: its entries and installed-entry ledger.
WITH entries AS (DELETE FROM "delayq_schedule_entries" WHERE "tableName" = %(table_name)s)
DELETE FROM "delayq_schedule_installed" WHERE "tableName" = %(table_name)s

-- uninstall_forget_schedulers --
-- The table's rows in the schedulers' heartbeats (migration 18), every front end's namespace.
DELETE FROM "delayq_schedule_schedulers"
WHERE "tableName" = %(table_name)s OR starts_with("tableName", %(table_name)s || '#')

-- uninstall_forget_task_results --
-- The table's task results (core/ledgers/task_results.py).
DELETE FROM "delayq_task_results" WHERE "tableName" = %(table_name)s

-- uninstall_drop_shared --
-- The tables every queue table of the database shares, once no queue table is left.
DROP TABLE IF EXISTS {migrations}, "delayq_schedule_entries", "delayq_schedule_installed",
    "delayq_schedule_schedulers", "delayq_task_results"

-- Blocks named schema_* take {schema} (the queue table's schema) and, for grants, {role} as
-- extra identifiers, like the grant_* blocks below; core/schema/migrations.py renders them at migration.

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

-- schema_controls_grant_poller --
-- Migration 21: what a role that polls needs for the claim of a controlled queue.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.{controls}, {schema}.{control_slots},
    {schema}.{control_keys} TO {role}

-- schema_controls_grant_reader --
-- Migration 21: what a role that reads the queue table (a monitor) needs to show the controls.
GRANT SELECT ON {schema}.{controls}, {schema}.{control_slots} TO {role}

-- schema_schedulers_grant_writer --
-- Migration 18: a role that writes the scheduling ledger (a scheduler's) records heartbeats.
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}."delayq_schedule_schedulers" TO {role}

-- schema_schedulers_grant_reader --
-- Migration 18: a role that reads the scheduling ledger (a monitor's) reads the heartbeats.
GRANT SELECT ON {schema}."delayq_schedule_schedulers" TO {role}

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
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}."delayq_task_results" TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.{controls}, {schema}.{control_slots},
    {schema}.{control_keys} TO {role}

-- grant_beat --
-- Schedulers (celery beat with the delayq scheduler, run as the worker role; the Dramatiq and
-- django.tasks workers' own): the entries, the ledger and the schedulers' heartbeats (each
-- heartbeat also deletes rows lapsed for a week).
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}."delayq_schedule_entries", {schema}."delayq_schedule_installed", {schema}."delayq_schedule_schedulers" TO {role}

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
-- status lists periodic entries; the task results: `delayq tasks list --state failed` and the
-- page's Failed tab read them), plus pg_monitor so
-- pg_stat_activity shows other roles' transactions (without it only this role's own are seen).
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON {schema}.{table}, {schema}.{bindings}, {schema}.{migrations} TO {role};
GRANT SELECT ON {schema}."delayq_task_results" TO {role};
GRANT SELECT ON {schema}.{controls}, {schema}.{control_slots} TO {role};
GRANT SELECT ON {schema}."delayq_schedule_entries", {schema}."delayq_schedule_installed",
    {schema}."delayq_schedule_schedulers" TO {role};
GRANT pg_monitor TO {role}
