"""CronService: recurring messages pre-installed into the DelayedQueue.

Each occurrence is a row keyed ``{prefix}/{configHash}/{epoch ms}``. Installers in any number of
processes compute the same keys for the same configuration, so the unique index makes the
first insert win and nobody duplicates a tick. The pitfalls each point below avoids are in
docs/explanation/design.md:

* LIKE patterns are escaped and anchored on ``prefix/``: ``_``/``%`` are literal and prefix
  ``a`` never touches ``ab/...``;
* ``uninstall_tick`` deletes the given configuration's rows (the original deleted the others);
* periodic ticks are installed over an explicit horizon (N occurrences or a time window,
  whichever reaches further), not one occurrence ahead;
* "now" is the database clock, and rows due within ``min_lead`` are never (re)created, so a
  late installer cannot revive a tick that already fired.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from ..db.errors import InvalidInput
from ..queue.counts import bounded_read
from ..queue.delayed_queue import DelayedQueue
from ..queue.timeutil import from_ms, to_ms
from ..queue.types import Offer, OfferOutcome, StoredMessage
from ..queue.validate import MAX_KEY_CHARS, like_escape, validate_key, validate_payload

log = logging.getLogger(__name__)

#: Rows due sooner than this are never (re)created by an installer.
DEFAULT_MIN_LEAD = timedelta(seconds=1)
#: Room the hash and timestamp need in a key: '/' + 32 hex + '/' + 13 digits.
_KEY_SUFFIX_CHARS = 1 + 32 + 1 + 13


def config_hash(*parts: object) -> str:
    """A stable hash of everything that shapes an occurrence (md5 hex, as in the original)."""
    text = "\x1f".join(repr(p) for p in parts)
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def validate_prefix(prefix: object) -> str:
    if not isinstance(prefix, str) or not prefix:
        raise InvalidInput(f"cron key prefix must be a non-empty str, got {prefix!r}")
    if "/" in prefix:
        raise InvalidInput(f"cron key prefix must not contain '/': {prefix!r}")
    if len(prefix) > MAX_KEY_CHARS - _KEY_SUFFIX_CHARS:
        raise InvalidInput(
            f"cron key prefix is {len(prefix)} characters, the limit is "
            f"{MAX_KEY_CHARS - _KEY_SUFFIX_CHARS}: {prefix[:40]!r}..."
        )
    return prefix


def validate_hash(value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value or len(value) > 32:
        raise InvalidInput(f"config hash must be 1-32 characters without '/': {value!r}")
    return value


#: Digits of the epoch ms that ends a cron key: 13 from 2001 to 2286; more bounds the key range.
KEY_MS_DIGITS = 20


def cron_key(prefix: str, hash_: str, at: datetime) -> str:
    return f"{prefix}/{hash_}/{to_ms(at, what='occurrence')}"


def parse_cron_key(key: str) -> tuple[str, str, datetime]:
    prefix, hash_, ms = key.rsplit("/", 2)
    return prefix, hash_, from_ms(int(ms))


@dataclass(frozen=True)
class CronMessage:
    """One occurrence to install."""

    scheduled_at: datetime
    payload: bytes


@dataclass(frozen=True)
class DailySchedule:
    """Times of day in a time zone; occurrences are wall-clock times converted to UTC.

    On a spring-forward day a nonexistent time runs at the same offset after the gap
    (02:30 -> 03:30); on a fall-back day an ambiguous time runs once, at its first instant.
    """

    hours_of_day: tuple[time, ...]
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))

    def __post_init__(self) -> None:
        if not self.hours_of_day:  # occurrences() would loop forever looking for one
            raise InvalidInput("a DailySchedule needs at least one time of day")

    def occurrences(self, after: datetime, until: datetime) -> list[datetime]:
        """Occurrences in ``(after, until]``, as UTC instants."""
        local_day = after.astimezone(self.zone).date() - timedelta(days=1)
        result: list[datetime] = []
        while True:
            for t in sorted(self.hours_of_day):
                wall = datetime.combine(local_day, t.replace(tzinfo=None, fold=0))
                at = wall.replace(tzinfo=self.zone)
                at = at.astimezone(ZoneInfo("UTC"))
                if at > after and at not in result:
                    if at > until:
                        return result
                    result.append(at)
            local_day += timedelta(days=1)


class CronHandle:
    """A running background installer; ``stop()`` ends it (rows already installed stay)."""

    def __init__(self, name: str, interval_s: float, run: Callable[[bool], None]) -> None:
        self._stop = threading.Event()
        self._first_done = threading.Event()
        self.errors = 0
        self._thread = threading.Thread(
            target=self._loop, args=(interval_s, run), name=f"delayq-cron-{name}", daemon=True
        )
        self._thread.start()

    def _loop(self, interval_s: float, run: Callable[[bool], None]) -> None:
        first = True
        while not self._stop.is_set():
            try:
                run(first)
                first = False
            except Exception:
                self.errors += 1
                log.exception("delayq: cron install failed; retrying in %.1fs", interval_s)
            self._first_done.set()
            self._stop.wait(interval_s)

    def wait_first_run(self, timeout: float | None = None) -> bool:
        """Block until the first install ran (True) or ``timeout`` passed (False)."""
        return self._first_done.wait(timeout)

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop installing; the rows already installed stay and run."""
        self._stop.set()
        self._thread.join(timeout)


class CronService:
    """Installs and uninstalls recurring messages of one queue kind."""

    def __init__(self, queue: DelayedQueue, *, min_lead: timedelta = DEFAULT_MIN_LEAD) -> None:
        self.queue = queue
        self.min_lead = min_lead
        #: Whether the table's keys sort byte by byte (read once, at the first install_tick).
        self._bytewise: bool | None = None

    # -- one-shot operations ----------------------------------------------------------

    def install_tick(
        self,
        config_hash: str,
        key_prefix: str,
        messages: Sequence[CronMessage],
        can_update: bool = True,
    ) -> list[OfferOutcome]:
        """Replace every other configuration of ``key_prefix`` by these occurrences."""
        hash_ = validate_hash(config_hash)
        prefix = validate_prefix(key_prefix)
        offers = [Offer(cron_key(prefix, hash_, m.scheduled_at), m.payload, m.scheduled_at)
                  for m in messages]
        q = self.queue
        patterns = self._patterns(prefix, hash_)
        deleted = q.db.execute(q.queries[self._delete_other_configs()],
                               patterns | {"lo": f"{prefix}/", "hi": f"{prefix}0"})
        if deleted:
            log.info("delayq: cron %s switched to config %s (%d old rows removed)",
                     prefix, hash_, deleted)
        return q.offer_batch(offers, can_update, min_lead=self.min_lead)

    def switch(self, config_hash: str, key_prefix: str, messages: Sequence[CronMessage], *,
               kinds: Sequence[str] = ()) -> tuple[int, list[str]]:
        """Replace every other configuration of ``key_prefix`` (in this kind and ``kinds``:
        where it was before a move) by these occurrences, from one instant on: now +
        ``min_lead``, on the database clock, in one statement (``cron_switch``). Rows due
        before it stay and run as installed, so no tick is lost or doubled at the switch
        (``install_tick`` deletes them all, and the new rows start after ``min_lead``).
        Returns (rows deleted, keys created)."""
        hash_, prefix = validate_hash(config_hash), validate_prefix(key_prefix)
        q = self.queue
        keys = [validate_key(cron_key(prefix, hash_, m.scheduled_at)) for m in messages]
        params = self._patterns(prefix, hash_) | {
            "kinds": sorted({q.kind, *kinds}), "keys": keys,
            "payloads": [validate_payload(m.payload) for m in messages],
            "ats": [to_ms(m.scheduled_at, what="occurrence") for m in messages],
            "min_lead_ms": self.min_lead // timedelta(milliseconds=1), "now": q.clock_ms()}
        row = q.db.fetchone(q.queries["cron_switch"], params)
        assert row is not None
        return int(row[0]), list(row[1])

    def uninstall_tick(self, config_hash: str, key_prefix: str) -> int:
        """Delete the rows of exactly this configuration; returns how many."""
        patterns = self._patterns(validate_prefix(key_prefix), validate_hash(config_hash))
        return self.queue.db.execute(self.queue.queries["cron_uninstall"], patterns)

    def uninstall(self, key_prefix: str) -> int:
        """Delete every configuration's rows of a prefix."""
        patterns = self._patterns(validate_prefix(key_prefix), "")
        patterns["config_pattern"] = patterns["prefix_pattern"]
        return self.queue.db.execute(self.queue.queries["cron_uninstall"], patterns)

    def installed(self, key_prefix: str, limit: int = 100,
                  config_hash: str | None = None) -> list[StoredMessage]:
        """The soonest installed occurrences of a prefix. With ``config_hash`` (the ledger's),
        only that configuration's, read from the key index: a bounded read at any table size,
        where walking the kind in time order passes every other row of the kind before the
        prefix's occurrences (what listing a daily entry among 5M tasks of its queue did)."""
        prefix = validate_prefix(key_prefix)
        if config_hash is None:
            params = self._patterns(prefix, "") | {"limit": limit}
            rows = self.queue.db.fetchall(self.queue.queries["cron_list"], params)
        else:
            first = f"{prefix}/{validate_hash(config_hash)}/"
            params = {"kind": self.queue.kind, "lo": first, "hi": first + "9" * KEY_MS_DIGITS,
                      "config_pattern": like_escape(first) + "%", "limit": limit}
            rows = bounded_read(self.queue, "cron_list_config", params)
        return [StoredMessage.from_row(r) for r in rows]

    def _delete_other_configs(self) -> str:
        """The statement that deletes a prefix's other configurations: through the key range
        where the keys sort byte by byte (the range then holds exactly the prefix's keys),
        else through the kind."""
        if self._bytewise is None:
            row = self.queue.db.fetchone(self.queue.queries["cron_keys_bytewise"])
            self._bytewise = bool(row and row[0])
        return "cron_delete_other_configs" if self._bytewise else "cron_delete_other_configs_like"

    def _patterns(self, prefix: str, hash_: str) -> dict[str, str]:
        return {
            "kind": self.queue.kind,
            "prefix_pattern": like_escape(f"{prefix}/") + "%",
            "config_pattern": like_escape(f"{prefix}/{hash_}/") + "%",
        }

    # -- background installers --------------------------------------------------------

    def install(
        self,
        config_hash: str,
        key_prefix: str,
        schedule_interval: timedelta,
        generate: Callable[[datetime], Sequence[CronMessage]],
    ) -> CronHandle:
        """Every ``schedule_interval`` install ``generate(now)``; the first run may update."""
        hash_, prefix = validate_hash(config_hash), validate_prefix(key_prefix)
        if schedule_interval <= timedelta(0):
            raise InvalidInput("schedule_interval must be positive")

        def run(first: bool) -> None:
            self.install_tick(hash_, prefix, generate(self.queue.now()), can_update=first)

        return CronHandle(prefix, schedule_interval.total_seconds(), run)

    def install_periodic_tick(
        self,
        key_prefix: str,
        period: timedelta,
        payload_for: Callable[[datetime], bytes],
        *,
        occurrences: int = 4,
        window: timedelta = timedelta(minutes=10),
        schedule_interval: timedelta | None = None,
    ) -> CronHandle:
        """Ticks on multiples of ``period`` since the epoch, so every installer agrees on them."""
        if period <= timedelta(0):
            raise InvalidInput("period must be positive")
        interval = schedule_interval or max(period / 4, timedelta(seconds=1))
        horizon = max(period * occurrences, window, interval * 2)

        def generate(now: datetime) -> list[CronMessage]:
            return [CronMessage(at, payload_for(at)) for at in periodic_times(now, period, horizon)]

        return self.install(config_hash("periodic-tick", period), key_prefix, interval, generate)

    def install_daily_schedule(
        self,
        key_prefix: str,
        schedule: DailySchedule,
        payload_for: Callable[[datetime], bytes],
        *,
        days_ahead: int = 4,
        schedule_interval: timedelta = timedelta(hours=6),
    ) -> CronHandle:
        """The next ``days_ahead`` days of a daily schedule, refreshed every interval."""
        hash_ = config_hash("daily", schedule.zone.key, sorted(schedule.hours_of_day))

        def generate(now: datetime) -> list[CronMessage]:
            until = now + timedelta(days=days_ahead)
            return [CronMessage(at, payload_for(at)) for at in schedule.occurrences(now, until)]

        return self.install(hash_, key_prefix, schedule_interval, generate)


def periodic_times(now: datetime, period: timedelta, horizon: timedelta) -> list[datetime]:
    """Multiples of ``period`` (epoch-aligned) in ``(now, now + horizon]``."""
    period_ms = period // timedelta(milliseconds=1)
    now_ms = to_ms(now, what="now")
    first = (now_ms // period_ms + 1) * period_ms
    last = now_ms + horizon // timedelta(milliseconds=1)
    count = max(1, (last - first) // period_ms + 1)  # every multiple up to now + horizon
    return [from_ms(first + i * period_ms) for i in range(count)]
