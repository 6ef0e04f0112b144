-- The ledgers: the run ledger (<table>__runs) and `delayq demo`'s run log.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- runs_part --
-- core/ledgers/runs.py: whether one part of a run was applied, asked before its writer stages anything.
SELECT "rows", "fingerprint" FROM {runs} WHERE "runId" = %(run_id)s AND "part" = %(part)s

-- runs_record --
-- core/ledgers/runs.py: a part applied, in the transaction that merged its rows (or, part -1, a whole
-- run). No row back: an attempt running at the same time recorded it first (this insert
-- waited for that attempt's commit), and the caller rolls back its own rows.
INSERT INTO {runs} ("runId", "part", "rows", "fingerprint", "appliedAt")
VALUES (%(run_id)s, %(part)s, %(rows)s, %(fingerprint)s, {now})
ON CONFLICT ("runId", "part") DO NOTHING
RETURNING 1

-- runs_state --
-- core/ledgers/runs.py: every entry of one run: its parts, and part -1 once the whole run is in.
SELECT "part", "rows", "fingerprint" FROM {runs} WHERE "runId" = %(run_id)s

-- runs_prune --
-- core/ledgers/runs.py: retention. Entries older than the retention, at most %(limit)s per call, found
-- through the appliedAt index (a call that finds none reads one index page).
DELETE FROM {runs}
WHERE ("runId", "part") IN (
    SELECT "runId", "part" FROM {runs}
    WHERE "appliedAt" < {now} - %(retention_ms)s::bigint
    LIMIT %(limit)s)

-- runs_forget --
-- core/ledgers/runs.py: drop a run's entries, so its next attempt applies everything again.
DELETE FROM {runs} WHERE "runId" = %(run_id)s

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

-- task_results_start --
-- A worker of Django's task framework begins an attempt (core/ledgers/task_results.py): the task's
-- result row is created RUNNING, or marked RUNNING again with this worker appended, unless it is
-- final already (the outcome was recorded, then the worker died before its ack was flushed: the
-- redelivery is acked without running the task again). No row back: final already. A row still
-- RUNNING is an attempt that never settled (its worker was killed, or lost the database for a
-- whole lease): `lost` is appended to its errors, its traceback the caller's `format()` template
-- filled with that attempt's number and worker. `aliveUntil` (database clock): the attempt's
-- liveness, renewed by task_results_touch while it runs.
INSERT INTO "delayq_task_results" AS r
    ("tableName", "id", "task", "status", "enqueuedAt", "startedAt", "lastAttemptedAt",
     "errors", "workerIds", "updatedAt", "aliveUntil")
VALUES (%(table_name)s, %(id)s, %(task)s::jsonb, 'RUNNING', %(enqueued_at)s::bigint,
        %(at)s::bigint, %(at)s::bigint, '[]'::jsonb, jsonb_build_array(%(worker_id)s::text),
        %(at)s::bigint, {now} + %(alive_ms)s::bigint)
ON CONFLICT ("tableName", "id") DO UPDATE
SET "status" = 'RUNNING', "lastAttemptedAt" = EXCLUDED."lastAttemptedAt",
    "workerIds" = r."workerIds" || EXCLUDED."workerIds", "updatedAt" = EXCLUDED."updatedAt",
    "aliveUntil" = EXCLUDED."aliveUntil",
    "errors" = CASE WHEN r."status" = 'RUNNING' THEN r."errors" || jsonb_build_array(
        jsonb_build_object('exception_class_path', %(lost_class)s::text,
                           'traceback', format(%(lost_template)s::text,
                                               jsonb_array_length(r."workerIds"),
                                               r."workerIds" ->> -1)))
        ELSE r."errors" END
WHERE r."status" NOT IN ('SUCCESSFUL', 'FAILED')
RETURNING r."startedAt", r."workerIds", r."errors"

-- task_results_touch --
-- The attempts a worker is running are alive (core/ledgers/task_results.py): their liveness is
-- pushed `alive_ms` past the database clock, a few times per that span. A reader takes a RUNNING
-- result whose liveness lapsed for interrupted (task_results_get), long before the queue row's
-- lease would tell. Only RUNNING rows: a settled or given-back attempt is not revived.
UPDATE "delayq_task_results" SET "aliveUntil" = {now} + %(alive_ms)s::bigint
WHERE "tableName" = %(table_name)s AND "id" = ANY(%(ids)s::text[]) AND "status" = 'RUNNING'

-- task_results_interrupt --
-- A worker gives an attempt back unsettled (its shutdown timeout ran out, or its outcome could not
-- be written): READY again, the interruption appended to its errors, before the queue row is
-- released. Only that attempt (its number is the length of workerIds) and only while it is
-- RUNNING: an outcome written meanwhile, or a later attempt, is left alone. No row back: left
-- alone.
UPDATE "delayq_task_results"
SET "status" = 'READY', "errors" = "errors" || %(errors)s::jsonb, "aliveUntil" = NULL,
    "updatedAt" = %(at)s::bigint
WHERE "tableName" = %(table_name)s AND "id" = %(id)s AND "status" = 'RUNNING'
  AND jsonb_array_length("workerIds") = %(attempt)s
RETURNING 1

-- task_results_finish --
-- An attempt's outcome: SUCCESSFUL or FAILED with its finish time, or READY again while a retry
-- waits; its error (if any) appended, its return value (JSON) kept, its liveness cleared.
-- Written before the queue row's ack.
UPDATE "delayq_task_results"
SET "status" = %(status)s, "finishedAt" = %(finished_at)s::bigint,
    "returnValue" = %(return_value)s::jsonb, "errors" = "errors" || %(errors)s::jsonb,
    "updatedAt" = %(at)s::bigint, "aliveUntil" = NULL
WHERE "tableName" = %(table_name)s AND "id" = %(id)s

-- task_results_get --
-- One task by key: its result row (none until a worker started it) and its queue row, waiting
-- or leased, among the kinds that start with `prefix` (found by the (pKey, pKind) index).
-- Always one row: both sides NULL means no such task. `interrupted`: the result says RUNNING but
-- nothing runs it: its attempt's liveness lapsed (its worker was killed or lost the database),
-- or its queue row is not held (given back unsettled) or gone; `scheduledAt` then says when it
-- runs again (a held row's lease end).
SELECT r."task", r."status", r."enqueuedAt", r."startedAt", r."lastAttemptedAt",
       r."finishedAt", r."returnValue", r."errors", r."workerIds", q."payload", q."lockUuid",
       q."scheduledAt", r."aliveUntil",
       r."status" = 'RUNNING' AND (COALESCE(r."aliveUntil" < {now}, false)
                                   OR q."lockUuid" IS NULL) AS interrupted
FROM (SELECT 1) AS one
LEFT JOIN "delayq_task_results" AS r ON r."tableName" = %(table_name)s AND r."id" = %(id)s
LEFT JOIN LATERAL (
    SELECT "payload", "lockUuid", "scheduledAt" FROM {table}
    WHERE "pKey" = %(id)s AND starts_with("pKind", %(prefix)s)
    LIMIT 1
) AS q ON true

-- task_results_prune --
-- Results that finished before `before`, at most `limit` per statement (the caller repeats
-- while a batch was full), oldest first, found by the (tableName, finishedAt) index. The ORDER
-- BY keeps it there in any session: without it, a generic plan (which guesses a third of the
-- rows match) or a backlog (most rows expired) made a sequential scan look cheaper for a LIMIT:
-- it reads the whole table when fewer than a batch expired, and batch after batch of a backlog
-- every row the earlier batches deleted (tests/integration/test_task_results_at_size.py, 1.1M
-- results). Only the relaxed pool's enable_seqscan=off held it.
DELETE FROM "delayq_task_results"
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM "delayq_task_results"
    WHERE "tableName" = %(table_name)s AND "finishedAt" < %(before)s::bigint
    ORDER BY "finishedAt"
    LIMIT %(limit)s
))

-- task_results_failed_index --
-- Migration 19: the failed results of each queue table, newest first, for the failure lists
-- (`delayq tasks list --state failed`, the page, the admin) and the health check's count. A
-- partial index: a successful task never enters it, so the workers' writes per task are the
-- same as before; a failed one adds one entry.
CREATE INDEX IF NOT EXISTS "delayq_task_results__failed"
ON "delayq_task_results" ("tableName", "finishedAt")
WHERE "status" = 'FAILED'

-- task_results_finished_index --
-- Migration 20: the finished results of each queue table by finish time (the prunes, the
-- finished list), replacing the index of migration 15 that also held every unfinished result.
-- Partial, so that only a statement bounding finishedAt can use it: both lead with tableName,
-- and a generic plan made while the table looked empty (its statistics say no rows; the plan
-- is kept until the table is next analyzed) found the old one as cheap as the primary key for
-- a result by (tableName, id), then read every result of the queue table through it as the
-- table grew (tests/integration/test_task_results_at_size.py).
CREATE INDEX IF NOT EXISTS "delayq_task_results__finished"
ON "delayq_task_results" ("tableName", "finishedAt")
WHERE "finishedAt" IS NOT NULL

-- task_results_drop_by_finished_at --
-- Migration 20: the index it replaces (gone already when another queue table migrated first).
DROP INDEX IF EXISTS "delayq_task_results__by_finished_at"

-- task_results_walk --
-- Finished results (SUCCESSFUL or FAILED), newest first after the keyset cursor (finishedAt,
-- id), at most `limit`, from the (tableName, finishedAt) index read backwards; with what a
-- list filters on (status, queue, task) and nothing heavy: the caller filters and then reads
-- the page's rows (task_results_by_ids). `lo` bounds how far back.
SELECT r."id", r."finishedAt", r."status", r."task"->>'queue', r."task"->>'task'
FROM "delayq_task_results" AS r
WHERE r."tableName" = %(table_name)s
  AND r."finishedAt" >= %(lo)s::bigint AND r."finishedAt" <= %(before_at)s::bigint
  AND (r."finishedAt", r."id") < (%(before_at)s::bigint, %(before_id)s::text)
ORDER BY r."finishedAt" DESC, r."id" DESC
LIMIT %(limit)s

-- task_results_walk_failed --
-- task_results_walk for FAILED results only, from the partial index of migration 19: the
-- failures of a table whose results are mostly successes cost what the failures do.
SELECT r."id", r."finishedAt", r."status", r."task"->>'queue', r."task"->>'task'
FROM "delayq_task_results" AS r
WHERE r."tableName" = %(table_name)s AND r."status" = 'FAILED'
  AND r."finishedAt" >= %(lo)s::bigint AND r."finishedAt" <= %(before_at)s::bigint
  AND (r."finishedAt", r."id") < (%(before_at)s::bigint, %(before_id)s::text)
ORDER BY r."finishedAt" DESC, r."id" DESC
LIMIT %(limit)s

-- task_results_by_ids --
-- Results by id (a page of a list, the retrying check of a listing's django.tasks rows), with
-- the last error only, the attempts, and the task's queue row if it still has one (waiting for
-- its retry, or leased), found by the (pKey, pKind) index.
SELECT r."id", r."task", r."status", r."enqueuedAt", r."startedAt", r."lastAttemptedAt",
       r."finishedAt", r."updatedAt", r."errors"->-1, jsonb_array_length(r."errors"),
       jsonb_array_length(r."workerIds"), q."id", q."scheduledAt", q."lockUuid"
FROM "delayq_task_results" AS r
LEFT JOIN LATERAL (
    SELECT "id", "scheduledAt", "lockUuid" FROM {table}
    WHERE "pKey" = r."id" AND starts_with("pKind", %(prefix)s)
    LIMIT 1
) AS q ON true
WHERE r."tableName" = %(table_name)s AND r."id" = ANY(%(ids)s::text[])

-- task_results_reopen --
-- Retry a failed task (core/ledgers/task_results.py): its result READY again, unfinished, its
-- errors and workers kept, in the transaction that offers its row anew (the caller rolls back
-- when the row cannot be offered). No row back: it is not FAILED (retried or discarded
-- meanwhile, pruned, or never failed).
UPDATE "delayq_task_results"
SET "status" = 'READY', "finishedAt" = NULL, "updatedAt" = %(at)s::bigint
WHERE "tableName" = %(table_name)s AND "id" = %(id)s AND "status" = 'FAILED'
RETURNING "task"

-- task_results_discard --
-- Forget a task that failed or waits for a retry: its waiting row (if any, and not held by a
-- worker) and its result, unless the result is SUCCESSFUL or a worker runs it (RUNNING). One
-- statement: the counts say what went.
WITH q AS (
    DELETE FROM {table}
    WHERE "pKey" = %(id)s AND starts_with("pKind", %(prefix)s) AND "lockUuid" IS NULL
    RETURNING "pKey"
), r AS (
    DELETE FROM "delayq_task_results"
    WHERE "tableName" = %(table_name)s AND "id" = %(id)s
      AND ("status" = 'FAILED' OR ("status" = 'READY' AND "id" IN (SELECT "pKey" FROM q)))
    RETURNING "id"
)
SELECT (SELECT count(*) FROM q), (SELECT count(*) FROM r)

-- task_results_failed_since --
-- Failed results of a table that finished at or after `since`, counted up to `cap` (the health
-- check): the partial index of migration 19.
SELECT count(*) FROM (
    SELECT 1 FROM "delayq_task_results"
    WHERE "tableName" = %(table_name)s AND "status" = 'FAILED'
      AND "finishedAt" >= %(since)s::bigint
    LIMIT %(cap)s
) AS x

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

-- task_results_alive_column --
-- Migration 17: each attempt's liveness (core/ledgers/task_results.py), so a reader can tell a
-- RUNNING result that nothing runs any more. Nullable, no default: no rewrite of the table.
ALTER TABLE "delayq_task_results" ADD COLUMN IF NOT EXISTS "aliveUntil" BIGINT
