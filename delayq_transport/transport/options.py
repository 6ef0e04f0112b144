"""The transport options (Celery's ``broker_transport_options``), declared once.

:data:`TRANSPORT_OPTIONS` gives each option its default, unit and meaning; the transport reads
its settings through it, and ``docs/reference/transport-options.md`` is rendered from it
(``python docs/_gen/reference.py``). The consumer's internal timings are the session's
(core/queue/session.py), shared with Dramatiq's consumer.
"""

from __future__ import annotations

from ..core.integrations import DEFAULT_BINDING_TTL_S as BINDINGS_TTL_S
from ..core.queue import (
    DEFAULT_FULL_RESCAN_INTERVAL_S,
    DEFAULT_MAX_PENDING,
    DEFAULT_PUT_TIMEOUT_S,
    MAX_LINGER_S,
    Option,
    Options,
)
from ..core.schema import DEFAULT_SCHEMA_WAIT_S
from ..formats.celery import PRIORITY_STEPS
from ..formats.deadletters import DEFAULT_RETENTION_S

TRANSPORT_OPTIONS = Options(
    Option("acquire_timeout", 60.0, "seconds",
           "Lease of a delivered, unacknowledged message. A live worker extends the leases of "
           "everything it holds every third of it, from a thread of its own (a long task keeps "
           "its lease even on the solo pool); a dead worker's messages come back after at most "
           "one lease."),
    Option("polling_interval", 5.0, "seconds",
           "Fallback poll. Consumers are woken by LISTEN/NOTIFY for new due rows and by a timer "
           "for the earliest known due time; this poll only covers missed notifications."),
    Option("unheard_polling_interval", 0.5, "seconds",
           "Poll interval of a consumer whose LISTEN cannot deliver (behind a transaction "
           "pooler without `listen_url`): the bound on how late a new task is found."),
    Option("pooling", "auto", "`auto`, `session` or `transaction`",
           "`auto` detects a pooler that drops session settings (PgBouncer) and then works as "
           "behind transaction pooling: no named prepared statements, settings per transaction "
           "(`SET LOCAL`), no LISTEN through it. `session` keeps the fast paths behind a "
           "session-pooling PgBouncer that ignores startup options. `transaction` skips the "
           "detection."),
    Option("listen_url", None, "libpq URL",
           "A direct PostgreSQL (or session-pooled) URL for the one LISTEN connection per "
           "consuming process, past a transaction pooler: push wake-ups instead of polling."),
    Option("table", "delayed_queue", "identifier",
           "Queue table (validated identifier); bindings live in `<table>__bindings`."),
    Option("database_url", None, "libpq URL",
           "A URL to connect to instead of the broker URL (e.g. a Unix socket: "
           "`postgresql://user@/db?host=/run/postgresql`, or `options=-csearch_path%3Ddelayq`).",
           shown="the broker URL"),
    Option("connect_timeout", 10.0, "seconds",
           "Per connection attempt, so a dead host of a failover list is left quickly. Under "
           "Celery, `broker_connection_timeout` (4 s by default) applies unless this is set.",
           shown="Celery's `broker_connection_timeout`, else 10.0"),
    Option("pool_size", 4, "connections",
           "Most connections of each of the process' two pools (flushed and relaxed commits), "
           "shared by every kombu connection of the process; a consuming process adds one "
           "LISTEN connection."),
    Option("pool_min_size", 0, "connections",
           "Connections each pool keeps open while idle; 0 opens them on first use."),
    Option("single_pool", False, "bool",
           "One pool per process instead of two: relaxed statements run in a transaction that "
           "sets their settings (`SET LOCAL`), so a publishing process holds one connection "
           "instead of two, at two more round trips per relaxed operation."),
    Option("batch_size", 100, "messages",
           "Most messages one poll takes (also capped by the prefetch window); acks are "
           "flushed when this many are buffered."),
    Option("ack_flush_interval", 0.05, "seconds",
           "Acks are deleted in batches at least this often."),
    Option("freeze_gc", True, "bool",
           "When the worker starts consuming, collect once and move what it built while "
           "starting (Celery, the app, its modules) to the collector's permanent generation "
           "(`gc.freeze()`), so a full collection on the worker's loop no longer walks it: "
           "measured, one such collection held countdowns up to 68 ms. Objects made afterwards "
           "are collected as before. False leaves the collector alone."),
    Option("priority_steps", list(PRIORITY_STEPS), "list of int",
           "Priority buckets, with the Redis transport's meaning: 0 is served first."),
    Option("dead_letter_retention", DEFAULT_RETENTION_S, "seconds",
           "How long a message rejected without requeue is kept as a dead letter of its "
           "queue ([which, and how](../how-to/manage-tasks.md#dead-letters)); 0 deletes it "
           "at once.",
           shown="604800.0 (7 days)"),
    Option("ensure_schema", True, "bool",
           "On connect, read the migrations ledger (SELECT only) and migrate only when a "
           "migration is missing. A role without DDL rights works once `delayq migrate` ran; "
           "when something is missing it fails naming the migrations. False skips the check."),
    Option("schema_wait", DEFAULT_SCHEMA_WAIT_S, "seconds",
           "How long a `celery worker` waits for delayq's tables before it exits ([a worker "
           "before `delayq migrate`](../how-to/upgrade.md#a-worker-before-delayq-migrate)); 0 "
           "exits at once."),
    Option("durable_publish", False, "bool",
           "True: a publish returns once its row is flushed to disk. False: once committed, "
           "before the flush ([what a crash can lose](../explanation/delivery.md"
           "#durability-of-a-publish))."),
    Option("durable_acks", False, "bool",
           "True: acks, lease extensions and releases wait for the WAL flush too. False: a "
           "PostgreSQL crash can only bring an acknowledged message back, never lose one."),
    Option("publish_linger", 0.0, "seconds",
           f"At most {MAX_LINGER_S:g}. A publish may wait this long in a buffer of the producer "
           "process; a thread writes what gathered as one multi-row insert per queue. On, "
           "`apply_async` returns before the row is written: a producer killed meanwhile loses "
           "up to that long of publishes (a clean exit writes the buffer first), and a write "
           "error is logged and retried, not raised. While the database is away the buffer "
           f"keeps up to {DEFAULT_MAX_PENDING:,} publishes, then `apply_async` blocks up to "
           f"{DEFAULT_PUT_TIMEOUT_S:g} s and raises `DatabaseUnavailable`. Refused with "
           "`durable_publish=True`.", shown="0.0 (off)"),
    Option("low_watermark", True, "bool",
           "Each poll starts above the rows this worker already took, where only dead index "
           "entries lie; NOTIFYs and the worker's own writes lower it."),
    Option("full_rescan_interval", DEFAULT_FULL_RESCAN_INTERVAL_S, "seconds",
           "With `low_watermark`: at least this often per queue, a probe in a thread of its own "
           "looks below the floor for a due row no NOTIFY announced and lowers the floor to it."),
    Option("unlogged_table", None, "bool",
           "True makes the queue table `UNLOGGED`, False logged again; unset leaves it as it "
           "is. Unlogged, no WAL is written for its rows, but a PostgreSQL crash empties the "
           "table (every waiting message and countdown) and standbys never receive it. "
           "Switching rewrites the table under an exclusive lock. Refused with "
           "`durable_publish=True`."),
    Option("max_message_size", 64 * 1024 * 1024, "bytes",
           "Larger messages are refused with an error naming the size.", shown="64 MiB"),
    Option("binding_ttl", BINDINGS_TTL_S, "seconds",
           "A fanout queue whose consumer was not seen for this long gets no more broadcasts "
           "(consumers refresh their bindings every 15 s: keep it above that). Auto-delete "
           "queues unseen for 10 minutes are removed with their rows."),
)

DEFAULT_ACQUIRE_TIMEOUT_S: float = TRANSPORT_OPTIONS.default("acquire_timeout")
DEFAULT_POLLING_INTERVAL_S: float = TRANSPORT_OPTIONS.default("polling_interval")
DEFAULT_BATCH_SIZE: int = TRANSPORT_OPTIONS.default("batch_size")
DEFAULT_POOL_SIZE: int = TRANSPORT_OPTIONS.default("pool_size")
DEFAULT_POOL_MIN_SIZE: int = TRANSPORT_OPTIONS.default("pool_min_size")
DEFAULT_CONNECT_TIMEOUT_S: float = TRANSPORT_OPTIONS.default("connect_timeout")
DEFAULT_ACK_FLUSH_INTERVAL_S: float = TRANSPORT_OPTIONS.default("ack_flush_interval")
DEFAULT_MAX_MESSAGE_BYTES: int = TRANSPORT_OPTIONS.default("max_message_size")
DEFAULT_BINDING_TTL_S: float = TRANSPORT_OPTIONS.default("binding_ttl")

#: Celery's broadcast exchange for remote control (``revoke`` of a waiting task deletes it).
CONTROL_EXCHANGE = "celery.pidbox"
#: Options that configure the shared :class:`~.backend.Backend` (pool and queue).
BACKEND_OPTIONS = ("table", "pool_size", "pool_min_size", "single_pool", "pooling", "listen_url",
                   "acquire_timeout", "ensure_schema", "schema_wait", "durable_acks",
                   "low_watermark", "full_rescan_interval", "unlogged_table", "publish_linger",
                   "connect_timeout")
