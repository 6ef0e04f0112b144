-- The database boundary's own statements: marking a session, naming the database a pool reaches.
-- Named blocks (`-- name --`, then a one-line comment) of the statements delayq sends, one per
-- operation of the data model (docs/explanation/design.md); every .sql file of the core's parts
-- is read by the one loader, delayq_transport/core/db/queries.py, and a name is used once.
-- `{table}`, `{notify_fn}` and friends are identifiers, validated and quoted by the loader;
-- `{now}` is the one clock expression, `COALESCE(%(now)s::bigint, <database clock in epoch
-- ms>)`: a queue built with an injected clock passes `now`, every other queue passes NULL, so
-- one queue never mixes clocks. Values are always bound parameters (`%(name)s`).

-- session_marker --
-- core/db/database.py: the marker setting sent with delayq's startup options, read back once: missing
-- when something between delayq and PostgreSQL (PgBouncer) refused or dropped the options.
SELECT current_setting(%(name)s, true)

-- database_identity --
-- core/queue/joined.py: which database a connection reaches, compared before a publish joins a
-- caller's transaction. The cluster's system identifier and start time tell apart two servers
-- (a restored copy shares the identifier, not the start); the name tells apart its databases.
-- Host names cannot: one server answers to several, and PgBouncer stands in for it.
SELECT current_database()::text, (SELECT system_identifier FROM pg_control_system())::text,
       pg_postmaster_start_time()::text
