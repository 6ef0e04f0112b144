"""What threatens a PostgreSQL queue, read from the catalogs: held-back cleanup and bloat.

Every lease ``UPDATE`` and ack ``DELETE`` leaves a dead row version (and index entries) at the
low end of the ``(pKind, scheduledAt)`` index, exactly where every poll starts. VACUUM removes
them only once no snapshot can still see them, so the oldest transaction of the *database*
(a ``pg_dump``, a report, an idle-in-transaction session, a forgotten prepared transaction) or
of the cluster (a standby with ``hot_standby_feedback``, a replication slot) decides how many
dead entries each poll walks. :func:`check_health` names those holders (pid, application, age)
and measures dead tuples and bloat, and :func:`assess` turns them into warnings with the
thresholds below (documented in docs/how-to/monitor.md). Nothing here reads the queue table itself;
``pgstattuple`` is not needed (bloat is an estimate from pg_class/pg_stats, labelled as such).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from ..db.database import Database
from ..db.queries import Queries

#: A transaction or snapshot older than this holds back cleanup long enough to matter.
XMIN_HORIZON_WARN_S = 300.0
#: ... and older than this it is critical (a queue at 300 tasks/s piles up 1M dead entries/h).
XMIN_HORIZON_CRITICAL_S = 3600.0
#: Idle in transaction this long: an application forgot to commit (holds locks and horizon).
IDLE_IN_TRANSACTION_WARN_S = 60.0
#: A prepared transaction this old is probably orphaned (it survives restarts).
PREPARED_XACT_WARN_S = 60.0
#: A horizon this many transaction ids old (replication slots report no time, only xids).
XMIN_AGE_WARN_XIDS = 1_000_000
#: Dead tuples worth a warning: more than this many *and* this fraction of the live rows.
DEAD_TUPLES_WARN = 10_000
DEAD_TUPLES_WARN_RATIO = 0.2
#: Estimated bloat worth a warning, for relations larger than BLOAT_MIN_BYTES.
BLOAT_WARN_RATIO = 0.5
BLOAT_MIN_BYTES = 8 * 1024 * 1024
#: Sessions younger than this are not listed: every running statement holds a snapshot.
MIN_BLOCKER_AGE_S = 1.0
MAX_BLOCKERS = 20

#: Bytes a heap tuple takes beyond its data: 23-byte header padded to 24, 4-byte line pointer.
HEAP_TUPLE_OVERHEAD = 28
#: Bytes an index tuple takes beyond its key: 8-byte header, 4-byte line pointer, padding.
INDEX_TUPLE_OVERHEAD = 16
BTREE_FILLFACTOR = 0.9


@dataclass(frozen=True)
class Blocker:
    """Something holding back the xmin horizon (source: session, standby, replication_slot,
    prepared_transaction); ``age_s`` is None where PostgreSQL keeps no start time."""

    source: str
    pid: int | None
    role: str | None
    application: str | None
    database: str | None
    state: str | None
    age_s: float | None
    xmin_age_xids: int | None
    detail: str | None

    @property
    def idle_in_transaction(self) -> bool:
        return bool(self.state and self.state.startswith("idle in transaction"))


@dataclass(frozen=True)
class Relation:
    """The queue table or one of its indexes; ``bloat_ratio`` is an estimate (None: unknown)."""

    name: str
    kind: str
    bytes: int
    bloat_ratio: float | None


@dataclass(frozen=True)
class Warning:
    level: str  # "warning" or "critical"
    subject: str
    message: str


@dataclass
class Health:
    blockers: list[Blocker]
    live_tuples: int | None
    dead_tuples: int | None
    since_vacuum_s: float | None
    since_analyze_s: float | None
    relations: list[Relation]
    warnings: list[Warning] = field(default_factory=list)

    @property
    def horizon_age_s(self) -> float:
        """Age of the oldest transaction or snapshot holding back cleanup (0: none)."""
        return max((b.age_s or 0.0 for b in self.blockers if b.xmin_age_xids), default=0.0)

    @property
    def horizon_age_xids(self) -> int:
        return max((b.xmin_age_xids or 0 for b in self.blockers), default=0)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["horizon_age_s"] = self.horizon_age_s
        out["horizon_age_xids"] = self.horizon_age_xids
        return out


def check_health(db: Database, table: str, *, min_age_s: float = MIN_BLOCKER_AGE_S) -> Health:
    """Read blockers, tuple counts and sizes (catalogs only), then attach the warnings."""
    q = Queries(table)

    def work(conn: psycopg.Connection[Any]) -> tuple[list[Any], Any, list[Any]]:
        blockers = conn.execute(q["health_blockers"],
                                {"min_age_s": min_age_s, "limit": MAX_BLOCKERS}).fetchall()
        return blockers, conn.execute(q["health_table"]).fetchone(), \
            conn.execute(q["health_indexes"]).fetchall()

    blocker_rows, t, index_rows = db.run(work)
    blockers = [Blocker(*r) for r in blocker_rows]
    if t is None:
        health = Health(blockers, None, None, None, None, [])
    else:
        (table_bytes, _total, live, dead, _mod, since_vac, since_an, row_width, block,
         fillfactor) = t
        relations = [Relation(table, "table", table_bytes,
                              _table_bloat(table_bytes, live, row_width, block, fillfactor))]
        relations += [Relation(name, "index", size, _index_bloat(size, live, width, block))
                      for name, size, _scans, width in index_rows]
        health = Health(blockers, live, dead, since_vac, since_an, relations)
    health.warnings = assess(health)
    return health


def _table_bloat(size: int, live: int | None, width: int | None, block: int,
                 fillfactor: int = 100) -> float | None:
    """Share of the heap beyond what the live rows need, inserts filling pages to
    ``fillfactor`` % (the free rest is room for leases, not bloat)."""
    if not size or live is None or width is None:
        return None
    usable = block * fillfactor / 100
    expected = math.ceil(live * (width + HEAP_TUPLE_OVERHEAD) / usable) * block
    return max(0.0, 1.0 - expected / size)


def _index_bloat(size: int, live: int | None, width: int | None, block: int) -> float | None:
    if not size or live is None or width is None:
        return None
    per_entry = 8 * math.ceil((width + INDEX_TUPLE_OVERHEAD) / 8)
    expected = (math.ceil(live * per_entry / (block * BTREE_FILLFACTOR)) + 1) * block  # + meta
    return max(0.0, 1.0 - expected / size)


def assess(health: Health) -> list[Warning]:
    """Warnings for what threatens the queue, by the thresholds of this module."""
    warnings = [w for b in health.blockers for w in _blocker_warnings(b)]
    live, dead = health.live_tuples or 0, health.dead_tuples or 0
    if dead > DEAD_TUPLES_WARN and dead > DEAD_TUPLES_WARN_RATIO * live:
        warnings.append(Warning("warning", "dead tuples", (
            f"{dead} dead tuples ({live} live): polls walk their index entries until VACUUM "
            "removes them; check what holds back cleanup and autovacuum")))
    for rel in health.relations:
        if rel.bloat_ratio is not None and rel.bloat_ratio > BLOAT_WARN_RATIO \
                and rel.bytes > BLOAT_MIN_BYTES:
            warnings.append(Warning("warning", f"bloat {rel.name}", (
                f"~{rel.bloat_ratio:.0%} of {rel.bytes // 1024**2} MiB is estimated free or "
                "dead space; VACUUM reuses it, REINDEX CONCURRENTLY (indexes) returns it")))
    if health.since_analyze_s is None and live > 100_000:
        warnings.append(Warning("warning", "statistics", (
            f"never analyzed with {live} rows: run ANALYZE (plans and estimates need it)")))
    return warnings


def _blocker_warnings(b: Blocker) -> list[Warning]:
    who = f"{b.source} pid={b.pid} application={b.application!r} role={b.role}"
    age = b.age_s or 0.0
    found: list[Warning] = []
    if b.source == "session" and b.idle_in_transaction and age > IDLE_IN_TRANSACTION_WARN_S:
        found.append(Warning("warning", who, (
            f"idle in transaction for {age:.0f}s: set idle_in_transaction_session_timeout")))
    if b.source == "prepared_transaction" and age > PREPARED_XACT_WARN_S:
        found.append(Warning("critical", f"prepared transaction {b.application!r}", (
            f"prepared {age:.0f}s ago and never committed: COMMIT/ROLLBACK PREPARED it")))
    if b.source == "replication_slot" and b.state == "inactive":
        found.append(Warning("critical", f"replication slot {b.application!r}", (
            f"inactive slot holds {b.detail}: drop it if its consumer is gone")))
    if b.xmin_age_xids and age > XMIN_HORIZON_WARN_S:
        level = "critical" if age > XMIN_HORIZON_CRITICAL_S else "warning"
        found.append(Warning(level, who, (
            f"holds back cleanup for {age:.0f}s ({b.xmin_age_xids} xids): dead queue rows "
            "pile up until it ends")))
    elif b.xmin_age_xids and b.xmin_age_xids > XMIN_AGE_WARN_XIDS and not found:
        found.append(Warning("warning", who, (
            f"holds back cleanup by {b.xmin_age_xids} transaction ids")))
    return found
