-- The kombu transport's exchange bindings (<table>__bindings) and fanout.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

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
