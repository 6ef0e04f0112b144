-- Spark's bulk writes: COPY into a staging table, one merge per flush.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- bulk_session_setup --
-- core/integrations/bulk.py: before the staging table exists in this session (PostgreSQL only takes it then),
-- room for a whole flush in local buffers, so staged rows are not written out to temp files.
SET temp_buffers = '128MB'

-- bulk_stage_create --
-- core/integrations/bulk.py: the per-connection staging table bulk writers COPY into (dropped with the
-- session; no migration). Same column types as the queue table so the merge casts nothing.
CREATE TEMP TABLE IF NOT EXISTS {stage} (
    "key" text NOT NULL, "kind" text NOT NULL, "payload" bytea NOT NULL, "at" bigint NOT NULL
)

-- bulk_stage_copy --
-- core/integrations/bulk.py: binary COPY of (key, kind, payload, at) tuples into the staging table.
COPY {stage} ("key", "kind", "payload", "at") FROM STDIN (FORMAT binary)

-- bulk_stage_truncate --
-- core/integrations/bulk.py: empty the staging table after a merge.
TRUNCATE {stage}

-- bulk_stage_drop --
-- core/integrations/bulk.py, behind a transaction pooler: drop the staging table before the commit, so the
-- server session the pooler lends to another client next keeps no table of ours.
DROP TABLE IF EXISTS {stage}

-- bulk_merge_ignore --
-- core/integrations/bulk.py: move staged rows into the queue; a key that exists (or repeats) is left alone,
-- so the row count is what was created. Ordered by key: two writers merging overlapping keys
-- lock them in the same order and cannot deadlock.
INSERT INTO {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
SELECT s."key", s."kind", s."payload", s."at", s."at", {now}
FROM {stage} AS s
ORDER BY s."key", s."kind"
ON CONFLICT ("pKey", "pKind") DO NOTHING

-- bulk_merge_update --
-- core/integrations/bulk.py: like bulk_merge_ignore, but a key that exists is replaced in place unless it is
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

-- bulk_copy_direct --
-- core/integrations/bulk.py: binary COPY straight into the queue table (no conflict handling). Only the
-- benchmark uses it, as the raw write limit the bulk writers are measured against.
COPY {table} ("pKey", "pKind", "payload", "scheduledAt", "scheduledAtInitially", "createdAt")
FROM STDIN (FORMAT binary)
