-- The queue table's hot path: publish, poll, ack, leases, wake-ups, the consumer's dead letters, counts.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- db_now --
-- The clock every queue uses unless a test injects its own.
SELECT {now} AS now

-- offer_insert --
-- Phase 1 of offer(): optimistic insert; 0 rows means the key exists. The stored scheduledAt
-- comes back so this process's low watermark can drop below it at once. The statement marks
-- itself with its statement_timestamp, so the insert trigger's WHEN skips it (migration 5): the
-- wake-up is this process' to send, at most one per short window (core/queue/announce.py). The
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
-- offer_batch() and concurrent offers of one process (core/queue/combine.py): one multi-row insert
-- from arrays (sent in binary: text-format arrays of bytea cost more to escape than the insert
-- itself); RETURNING names the keys that were created, every other key already existed (or
-- repeats within the batch). Rows closer to now than `min_lead_ms` are not inserted
-- (CronService: a late installer must not revive a fired tick). Skips the insert trigger as
-- offer_insert does, and carries this process' wake-up the same way when `announce`: every
-- distinct scheduledAt created per kind, the first `max_listed` one by one and a search
-- marker (chr(30) || kind || ':' || ms) at the first one left out, and the rows `pending`,
-- notified at this commit (core/queue/announce.py).
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
-- and sort scans off (core/db/database.py): a sort is how any other index could serve the ORDER BY.
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
-- The low watermark's safety net, in a thread of its own (core/queue/watermark.py): per kind, the
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

-- listen --
-- Subscribe a connection to this table's wake-ups.
LISTEN {channel}

-- announce --
-- core/queue/announce.py: this process' wake-ups ("kind:ms", the earliest new scheduledAt of each
-- kind), sent after the publishes' commits in a transaction of their own, at most one per
-- short window (a leading one at once, a trailing one at the window's end). Its transaction
-- commits without waiting for the WAL flush (SET LOCAL, whatever the session's setting): a
-- wake-up lost in a server crash only delays a pick-up to the consumers' fallback poll.
SELECT set_config('synchronous_commit', 'off', true), pg_notify({channel_literal}, p)
FROM unnest(%(payloads)s::text[]) AS p

-- listen_probe --
-- core/queue/listen.py: a notification sent from another (pooled) connection, which a new LISTEN
-- connection waits for: behind a pooler LISTEN succeeds and its notifications never arrive.
SELECT pg_notify({channel_literal}, %(payload)s)

-- unlisten --
-- core/queue/listen.py: leave the channel before giving up on a LISTEN that cannot deliver, so the
-- server session a pooler hands to someone else does not keep receiving every wake-up.
UNLISTEN *

-- once_claim --
-- core/queue/once.py: record the ids of the messages offer_once() is about to insert, in the
-- transaction of their rows. An id already recorded is not returned: that message was offered
-- before, and nothing of it is written again. A concurrent claim of one id waits for this one;
-- ids are claimed in order, so two callers claiming overlapping ids cannot deadlock.
INSERT INTO {runs} ("runId", "part", "rows", "fingerprint", "appliedAt")
SELECT s.id, %(part)s, 1, 0, {now} FROM unnest(%(ids)s::text[]) AS s(id) ORDER BY s.id
ON CONFLICT ("runId", "part") DO NOTHING
RETURNING "runId"

-- once_identical --
-- core/queue/once.py: which offers whose key was taken find their very payload there (the message
-- itself, offered before: recorded, nothing written); the others are conflicts. Each pair
-- is one probe of the unique (pKey, pKind) index.
SELECT s.id
FROM unnest(%(ids)s::text[], %(keys)b::text[], %(kinds)b::text[], %(payloads)b::bytea[])
     AS s(id, key, kind, payload)
JOIN {table} AS t ON t."pKey" = s.key AND t."pKind" = s.kind AND t."payload" = s.payload

-- once_forget --
-- core/queue/once.py: drop once-offered ids (their messages left their source, or were conflicts
-- of this very transaction); the ledger's primary key finds each.
DELETE FROM {runs} WHERE "part" = %(part)s AND "runId" = ANY(%(ids)s::text[])

-- Statements of partitions that are kept, not consumed (Dramatiq's dead letters), and of
-- whole-partition inspection; used through
-- core/queue/partitions.py.

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

-- kinds_ending --
-- Kinds present that end in a (LIKE-escaped) suffix: a loose index scan of the (pKind,
-- scheduledAt) index, one probe per kind present, not a scan of the rows (the dead-letter
-- expiry of formats/deadletters.py runs it every minute in every consuming process).
WITH RECURSIVE k AS (
    (SELECT "pKind" AS kind FROM {table} ORDER BY "pKind" LIMIT 1)
    UNION ALL
    SELECT (SELECT "pKind" FROM {table} WHERE "pKind" > k.kind ORDER BY "pKind" LIMIT 1)
    FROM k WHERE k.kind IS NOT NULL
)
SELECT kind FROM k WHERE kind LIKE %(pattern)s ESCAPE '\'

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

-- Statements of the web page's dead letters and workers (core/queue/leases.py, core/queue/partitions.py).
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
-- core/queue/leases.py groups locks into worker processes by the tag that starts each lock id.
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
