"""Defaults of the transport options (``broker_transport_options``), in one place.

Each is documented in :mod:`.transport`'s docstring; durations are seconds.
"""

from __future__ import annotations

from ..core import bindings

DEFAULT_ACQUIRE_TIMEOUT_S = 60.0
DEFAULT_POLLING_INTERVAL_S = 5.0
#: The poll interval of a worker whose LISTEN cannot deliver (behind a transaction pooler
#: without a direct ``listen_url``): the bound on how late a newly published task is found.
DEFAULT_UNHEARD_POLLING_INTERVAL_S = 0.5
DEFAULT_BATCH_SIZE = 100
DEFAULT_POOL_SIZE = 4
#: Connections each of a process' two pools keeps open while idle. 0: opened on first use.
#: With 1 (before issue 26) a pool used right after it opened held 2: the first statement
#: did not wait for the connection the pool was still opening and grew the pool by one, so
#: every producer and pool child held 4 connections where it used 2.
DEFAULT_POOL_MIN_SIZE = 0
#: Per connection attempt (kombu's ``connect_timeout`` overrides it: Celery's
#: ``broker_connection_timeout``), so a dead host of a failover list is left quickly.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_ACK_FLUSH_INTERVAL_S = 0.05
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_BINDING_TTL_S = bindings.DEFAULT_BINDING_TTL_S
#: After a timer fires and finds nothing (clock skew between host and database), retry soon.
SKEW_RETRY_S = 0.005
#: While a channel has a backlog, the LISTEN socket is read this often instead of on every
#: notification (see Wakeups.deafen).
BACKLOG_DRAIN_INTERVAL_S = 0.1
#: How long closing waits for a poll in flight, to give its messages back at once.
DEFAULT_CLOSE_WAIT_S = 5.0
#: Celery's broadcast exchange for remote control (``revoke`` of a waiting task deletes it).
CONTROL_EXCHANGE = "celery.pidbox"
#: Options that configure the shared :class:`~.backend.Backend` (pool and queue).
BACKEND_OPTIONS = ("table", "pool_size", "pool_min_size", "single_pool", "pooling", "listen_url",
                   "acquire_timeout", "ensure_schema", "durable_acks", "low_watermark",
                   "full_rescan_interval", "unlogged_table", "publish_linger")
