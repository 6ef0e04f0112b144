"""Which configuration is in force when schedulers of different configurations run at once: a
rolling deploy (the old release and the new one), or its rollback. Written once, for Celery
beat, Dramatiq's periodic actors and django.tasks' periodic tasks alike.

Without a rule, each scheduler installs its own configuration and uninstalls every entry it
lacks, so two configurations undo each other at every refresh and whoever refreshed last wins:
ticks of the entries one lacks vanish until the other's next refresh, and a changed entry
flips between its two hashes. The rule (docs/how-to/beat.md#two-configurations-at-once):

1. Every refresh starts with a heartbeat (``delayq_schedule_schedulers``, one statement): the
   scheduler's configuration (a hash of its front end's entries: name, config hash and queue
   kind each, or "invalid") and when any scheduler of its ledger (front end and table) first
   ran that configuration; alive for :data:`~.plans.ALIVE_INTERVALS` refresh intervals.
2. In force is, of the configurations of the schedulers alive, the one first seen last (one
   with a valid entry over one with none: a worker that declares no periodic entry, or only
   broken ones, takes nothing over): the new release's as soon as one of its schedulers runs.
3. Its schedulers act (install, replace, uninstall, catch up, sweep misfires) once every
   scheduler alive has seen it in force (so a refresh another configuration began before has
   ended); every other scheduler only beats: it installs and uninstalls nothing.
4. When its schedulers are gone (a stop retires the heartbeat at once, a kill lets it lapse),
   the newest configuration still alive is in force again: a rollback needs nothing more.

A refresh that takes long renews its heartbeat between its writes (:meth:`Authority.guard`),
and stops writing once its scheduler has gone unheard for long enough that it may have lapsed:
authority never passes while a refresh of the old holder still writes.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from datetime import timedelta

from ..core import DelayqError
from ..core.integrations import Standing, config_hash
from ..core.queue import from_ms
from .plans import Settings
from .store import EntryStore

log = logging.getLogger(__name__)

#: A lapsed scheduler's row is kept this long: it remembers when its configuration was first
#: seen, so an old release's scheduler restarted during a deploy does not count as new.
KEEP = timedelta(days=7)
#: An entry of a configuration that will not be installed (invalid, or refused by the front
#: end): it counts, as such, in the configuration's hash.
INVALID = "invalid"
_HASH_VERSION = "delayq-config-1"


def configuration_hash(shapes: Mapping[str, str]) -> str:
    """The hash of a configuration: each entry's name and shape (config hash and kind, or
    :data:`INVALID`), in name order."""
    return config_hash(_HASH_VERSION, sorted(shapes.items()))


class Lapsed(Exception):
    """This scheduler went unheard for so long that another configuration may be in force:
    the refresh stops writing (the next one beats again)."""


class Authority:
    """One scheduler's standing among those of its ledger. Its id changes in a forked child,
    so each process counts as its own scheduler."""

    def __init__(self, store: EntryStore, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        self._pid = 0
        self._id = ""
        self._said: tuple[object, ...] = ()
        #: Monotonic time the last heartbeat (or renewal) was sent: it is alive until at least
        #: this plus ``alive_for`` on the database's clock.
        self._beat_at = 0.0
        #: Whether the last heartbeat let this scheduler act.
        self.acting = False

    @property
    def scheduler_id(self) -> str:
        if self._pid != os.getpid():
            self._pid, self._id = os.getpid(), uuid.uuid4().hex
        return self._id

    def heartbeat(self, shapes: Mapping[str, str], now_ms: int | None = None) -> Standing:
        """Record this scheduler's configuration and read its standing; :attr:`acting` says
        whether this refresh may write (each change of standing is logged once)."""
        own = configuration_hash(shapes)
        self._beat_at = time.monotonic()
        standing = self.store.heartbeat(
            self.scheduler_id, f"{socket.gethostname()}:{os.getpid()}", own,
            sum(shape != INVALID for shape in shapes.values()),
            alive_ms=_ms(self.settings.alive_for), keep_ms=_ms(KEEP), now_ms=now_ms)
        self.acting = standing.in_force == own and not standing.lagging
        self._say(own, standing)
        return standing

    def guard(self, now_ms: int | None = None) -> None:
        """Before each write of a refresh: renew the heartbeat once a refresh interval has
        passed since it was sent; raise :class:`Lapsed` when it was sent so long ago (all but
        one interval of ``alive_for``) that it may lapse before the write, or had lapsed."""
        since = time.monotonic() - self._beat_at
        interval = self.settings.refresh_interval.total_seconds()
        if since < interval:
            return
        if since < self.settings.alive_for.total_seconds() - interval:
            sent = time.monotonic()
            if self.store.renew(self.scheduler_id, alive_ms=_ms(self.settings.alive_for),
                                now_ms=now_ms):
                self._beat_at = sent
                return
        self.acting = False
        raise Lapsed(f"delayq schedule: {self.store.ledger_name}: this refresh took {since:.1f}"
                     " s, so long that this scheduler's heartbeat may have lapsed; it stops "
                     "writing until its next refresh")

    def retire(self, now_ms: int | None = None) -> None:
        """This scheduler stops: the others need not wait for its heartbeat to lapse. A
        failure (the database gone) is logged: the heartbeat then lapses by itself."""
        if not self._id or self._pid != os.getpid():
            return  # never beat in this process
        try:
            self.store.retire(self._id, now_ms)
        except DelayqError as exc:
            log.warning("delayq schedule: %s: could not retire this scheduler (its heartbeat "
                        "lapses in %s): %s", self.store.ledger_name, self.settings.alive_for,
                        exc)
        self.acting = False

    def _say(self, own: str, s: Standing) -> None:
        state = (own, s.in_force, self.acting, s.lagging)
        if state == self._said:
            return
        self._said = state
        where = self.store.ledger_name
        if self.acting:
            log.info("delayq schedule: %s: configuration %s in force (%d other scheduler(s) "
                     "alive); this scheduler installs", where, own, s.others)
        elif s.in_force == own:
            log.info("delayq schedule: %s: configuration %s in force; installing once the "
                     "scheduler(s) of another configuration have seen it: %s", where, own,
                     ", ".join(s.lagging))
        else:
            log.warning(
                "delayq schedule: %s: this scheduler's configuration %s is not in force: %s "
                "is (first seen %s; this one %s). This scheduler installs and "
                "uninstalls nothing while a scheduler of that configuration is alive",
                where, own, s.in_force, from_ms(s.in_force_since_ms).isoformat(),
                from_ms(s.own_since_ms).isoformat())


def _ms(delta: timedelta) -> int:
    return delta // timedelta(milliseconds=1)
