-- Statements of fleet-wide control (core/queue/controls.py): paused queues, concurrency and rate
-- limits, in migration 21's tables; the claim itself is the function controls_claim_function
-- (core/schema/schema.sql) that `claim_controlled` calls.

-- claim_controlled --
-- The poll of a controlled queue's kinds: one call of the claim function (see there), rows in
-- try_poll_many's columns. `key_paths` (one per kind, NULL: no key) are dotted JSON paths.
SELECT * FROM {claim_fn}(%(name)s, %(kinds)s::text[], %(key_paths)s::text[], %(limit)s,
                         %(lock)s, %(lease_ms)s, %(now)s::bigint, %(want_next)s,
                         %(retry_ms)s, %(key_window)s, %(burst_ms)s)

-- controls_read --
-- Every control row: what a consumer routes its kinds by (core/queue/controls.py: Controls).
SELECT "name", "paused", "concurrency", "keyConcurrency", "rateCount", "rateMs",
       "keyRateCount", "keyRateMs"
FROM {controls}
ORDER BY "name"

-- control_lock --
-- A change reads the row it changes under its lock (absent: no control yet).
SELECT "name", "paused", "concurrency", "keyConcurrency", "rateCount", "rateMs",
       "keyRateCount", "keyRateMs"
FROM {controls}
WHERE "name" = %(name)s
FOR UPDATE

-- control_upsert --
-- Write a queue's control; a changed rate starts with a full bucket (tokens are capped to the
-- burst at the next claim). Every consumer of the table hears of it (a marker wake-up).
WITH up AS (
    INSERT INTO {controls} AS c ("name", "paused", "concurrency", "keyConcurrency", "rateCount",
                                 "rateMs", "keyRateCount", "keyRateMs", "tokens", "refilledAt",
                                 "updatedAt")
    VALUES (%(name)s, %(paused)s, %(concurrency)s, %(key_concurrency)s, %(rate_count)s,
            %(rate_ms)s, %(key_rate_count)s, %(key_rate_ms)s, 'Infinity', {now}, {now})
    ON CONFLICT ("name") DO UPDATE
    SET "paused" = EXCLUDED."paused", "concurrency" = EXCLUDED."concurrency",
        "keyConcurrency" = EXCLUDED."keyConcurrency", "rateCount" = EXCLUDED."rateCount",
        "rateMs" = EXCLUDED."rateMs", "keyRateCount" = EXCLUDED."keyRateCount",
        "keyRateMs" = EXCLUDED."keyRateMs",
        "tokens" = CASE WHEN (c."rateCount", c."rateMs")
                             IS NOT DISTINCT FROM (EXCLUDED."rateCount", EXCLUDED."rateMs")
                        THEN c."tokens" ELSE 'Infinity' END,
        "updatedAt" = EXCLUDED."updatedAt"
    RETURNING 1
)
SELECT pg_notify({channel_literal}, %(note)s) FROM up

-- control_delete --
-- A queue with nothing left to control goes back to the plain claim: its control row, slots
-- and key buckets go; consumers hear of it.
WITH c AS (DELETE FROM {controls} WHERE "name" = %(name)s),
     s AS (DELETE FROM {control_slots} WHERE "name" = %(name)s),
     k AS (DELETE FROM {control_keys} WHERE "name" = %(name)s)
SELECT pg_notify({channel_literal}, %(note)s)

-- controls_use --
-- What each control holds now: slots whose row is still leased (running or prefetched), the
-- keys holding them, and the queue's tokens refilled to now (NULL: no rate).
SELECT c."name", c."paused", c."concurrency", c."keyConcurrency", c."rateCount", c."rateMs",
       c."keyRateCount", c."keyRateMs",
       (SELECT count(*) FROM {control_slots} AS s JOIN {table} AS t
               ON t."id" = s."id" AND t."lockUuid" = s."lock" AND t."scheduledAt" > n.now
        WHERE s."name" = c."name") AS in_use,
       (SELECT count(DISTINCT s."key") FROM {control_slots} AS s JOIN {table} AS t
               ON t."id" = s."id" AND t."lockUuid" = s."lock" AND t."scheduledAt" > n.now
        WHERE s."name" = c."name" AND s."key" IS NOT NULL) AS keys_in_use,
       CASE WHEN c."rateCount" IS NOT NULL THEN
           LEAST(GREATEST(1.0, c."rateCount"::float8 * %(burst_ms)s / c."rateMs"),
                 c."tokens" + GREATEST(n.now - c."refilledAt", 0)::float8 * c."rateCount"
                              / c."rateMs") END AS tokens,
       c."updatedAt"
FROM {controls} AS c CROSS JOIN (SELECT {now} AS now) AS n
ORDER BY c."name"
