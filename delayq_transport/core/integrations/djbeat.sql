-- Django-celery-beat's own tables, for `delayq beat import` and a beat in admin mode.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- runs_prune_part --
-- core/ledgers/runs.py: retention of one kind of entry (`part`), at most %(limit)s per call, through the
-- appliedAt index: beat occurrences recorded in django-celery-beat's run history (part -3) are
-- kept a day, whatever retention Spark's runs use.
DELETE FROM {runs}
WHERE ("runId", "part") IN (
    SELECT "runId", "part" FROM {runs}
    WHERE "appliedAt" < {now} - %(retention_ms)s::bigint AND "part" = %(part)s
    LIMIT %(limit)s)

-- djbeat_present --
-- core/integrations/djbeat.py: whether django-celery-beat's tables are in this database (its task table, from
-- the catalog alone), so a listing that merely may show them asks before it reads: a read of a
-- missing table is an error in the server's log at every refresh of the page.
SELECT to_regclass({djbeat_task_literal}) IS NOT NULL

-- djbeat_read --
-- core/integrations/djbeat.py: django-celery-beat's change mark (PeriodicTasks.last_update, bumped by its
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
-- core/integrations/djbeat.py: enable or disable periodic tasks by name (`delayq beat import
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
-- core/integrations/djbeat.py: beat occurrences a worker received, written to their periodic task's run
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
