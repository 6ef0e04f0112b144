"""``delayq beat import``: another scheduler's entries become delayq_beat's DB-backed entries.

:func:`plan` compares what the source holds with what is stored and says, per entry, what an
import does: ``create``, ``update``, ``unchanged``, ``refused`` (with the reason), ``left out``
(``--exclude``), or ``kept`` (stored from an earlier import, gone from the source since: left
alone). :func:`apply` writes it.

All or nothing: while any entry is refused (it cannot be carried, or a DB-backed entry of that
name exists that no import of this source stored), nothing is written. A refused entry left in
the old scheduler would stop running the moment its beat is switched off, which is the silent
loss this command exists to prevent; ``--exclude NAME`` leaves one out knowingly. The entries
are written by one statement, so an interrupted import leaves none half-written, and a re-run
writes nothing when nothing changed (same entries, same definitions).

Each stored definition records where it came from (``origin``: the source kind, and whether
this import disabled the source entry), which is how a re-run recognises its own entries (and a
source entry it disabled itself), and how ``--undo`` removes exactly them, uninstalls their
occurrences at once and re-enables exactly the source entries it disabled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from delayq_transport.core import InvalidInput
from delayq_transport.core.integrations import CronService
from delayq_transport.core.queue import DelayedQueue, to_ms
from delayq_transport.scheduling import bounds
from delayq_transport.scheduling.carried import Carried, Refused
from delayq_transport.scheduling.entries import key_prefix, make_spec
from delayq_transport.scheduling.store import EntryStore, InstalledEntry, StoredEntry
from delayq_transport.scheduling.times import occurrences

from .sources import Item, Source

#: Occurrences a plan shows per entry.
SHOWN = 2


@dataclass
class Step:
    """What an import does with one entry."""

    name: str
    action: str  # create | update | unchanged | refused | left out | kept
    entry: Carried | None = None
    reason: str = ""
    disable_source: bool = False
    next_runs: list[datetime] = field(default_factory=list)

    @property
    def writes(self) -> bool:
        return self.action in ("create", "update")


@dataclass
class Plan:
    source: Source
    steps: list[Step]

    @property
    def refused(self) -> list[Step]:
        return [s for s in self.steps if s.action == "refused"]

    @property
    def to_disable(self) -> list[str]:
        """Source entries this import disables (enabled there now)."""
        return [s.name for s in self.steps if s.disable_source and s.entry is not None
                and s.entry.source_enabled and s.action != "left out"]


def origin_of(row: StoredEntry | None) -> dict[str, Any]:
    origin = ((row.definition or {}) if row else {}).get("origin")
    return origin if isinstance(origin, dict) else {}


def plan(source: Source, store: EntryStore, *, disable_source: bool = False,
         exclude: Iterable[str] = (), now: datetime | None = None,
         zone: tzinfo = UTC) -> Plan:
    """Read the source and decide every entry's step (nothing written)."""
    now = now or datetime.now(UTC)
    stored = {e.name: e for e in store.entries()}
    left_out = set(exclude)
    steps = [_step(item, stored, source, disable_source, left_out, now, zone)
             for item in source.read()]
    seen = {s.name for s in steps}
    for name, row in sorted(stored.items()):
        if name not in seen and origin_of(row).get("source") == source.kind:
            steps.append(Step(name, "kept", reason=f"no longer in {source.kind}: the stored "
                                                   "entry is left as it is"))
    unknown = left_out - seen
    for name in sorted(unknown):
        steps.append(Step(name, "refused", reason=f"--exclude {name!r}: no such entry in "
                                                  f"{source.kind}"))
    return Plan(source, steps)


def _step(item: Item, stored: dict[str, StoredEntry], source: Source, disable_source: bool,
          left_out: set[str], now: datetime, zone: tzinfo) -> Step:
    if isinstance(item, Refused):
        step = Step(item.name, "refused", reason=item.reason)
        return replace(step, action="left out") if item.name in left_out else step
    row = stored.get(item.name)
    origin = origin_of(row)
    if item.name in left_out:
        return Step(item.name, "left out", item, "excluded: stays in the source only")
    if row is not None and origin.get("source") != source.kind:
        what = "an enable/disable override" if row.definition is None else "a DB-backed entry"
        return Step(item.name, "refused", item, f"{what} of that name exists that no import "
                                                f"from {source.kind} stored: remove or rename it")
    # Disabled in the source by an earlier import: the entry is what it was when enabled.
    ours_disabled = bool(origin.get("disabled_source")) and not item.source_enabled
    entry = replace(item, enabled=not item.history.get("ran")) if ours_disabled else item
    disabling = ours_disabled or (disable_source and entry.source_enabled)
    definition = stored_definition(entry, source.kind, disabling)
    if row is None:
        action = "create"
    elif row.definition == definition and row.enabled == entry.enabled:
        action = "unchanged"
    else:
        action = "update"
    return Step(entry.name, action, entry, disable_source=disabling,
                next_runs=_next_runs(entry, now, zone))


def stored_definition(entry: Carried, kind: str, disabled_source: bool) -> dict[str, Any]:
    """As stored (and read back: JSON types), with the origin."""
    import json

    definition = entry.definition()
    definition["origin"] = {"source": kind, "disabled_source": disabled_source}
    return dict(json.loads(json.dumps(definition, sort_keys=True)))


def _next_runs(entry: Carried, now: datetime, zone: tzinfo) -> list[datetime]:
    """The first occurrences delayq would install after ``now`` (first install: ``now``)."""
    if not entry.enabled:
        return []
    spec = make_spec(entry.name, entry.task, entry.schedule, entry.args, entry.kwargs,
                     entry.options)
    first = int(now.timestamp() * 1000) if bounds.needs_first_install(spec) else None
    window = bounds.window(spec, first)
    return occurrences(window, now, now, spec.zone or zone, SHOWN)[:SHOWN]


def apply(plan_: Plan, store: EntryStore) -> list[str]:
    """Write the plan (refused entries: nothing at all); then disable the source entries.
    Returns the source entries disabled."""
    if plan_.refused:
        raise Refused(plan_.refused[0].name, "refused: nothing imported")
    writes = [s for s in plan_.steps if s.writes and s.entry is not None]
    store.put_many([(s.name, stored_definition(s.entry, plan_.source.kind, s.disable_source),
                     s.entry.enabled) for s in writes if s.entry is not None])
    return plan_.source.set_enabled(plan_.to_disable, False) if plan_.to_disable else []


@dataclass
class Undo:
    """What ``--undo`` removes and re-enables."""

    entries: list[str]
    reenable: list[str]
    uninstalled: dict[str, int] = field(default_factory=dict)
    #: One-offs the import disabled whose one run came while delayq had them: left disabled.
    ran_here: list[str] = field(default_factory=list)


def plan_undo(source: Source, store: EntryStore, now: datetime | None = None) -> Undo:
    """The imported entries, and the source entries to re-enable: those the import disabled,
    except a one-off whose one run came while delayq had it (re-enabled, the old scheduler
    would run it again)."""
    now = now or datetime.now(UTC)
    rows = [e for e in store.entries() if origin_of(e).get("source") == source.kind]
    ledger = {i.name: i for i in store.installed()}
    reenable, ran = [], []
    for row in rows:
        if not origin_of(row).get("disabled_source"):
            continue
        if _ran_once(row, ledger.get(row.name), now):
            ran.append(row.name)
        else:
            reenable.append(row.name)
    return Undo([e.name for e in rows], reenable, ran_here=ran)


def _ran_once(row: StoredEntry, installed: InstalledEntry | None, now: datetime) -> bool:
    if installed is None:
        return False
    try:
        spec = row.spec()
    except InvalidInput:
        return False
    first = installed.first_installed_ms
    at = bounds.the_instant(spec, first, spec.zone or UTC)
    return at is not None and at <= now and installed.installed_until_ms >= to_ms(at)


def undo(source: Source, queue: DelayedQueue, store: EntryStore, todo: Undo) -> Undo:
    """Remove the imported entries, uninstall their waiting occurrences now (no beat needs to
    run for that), and re-enable the source entries the import disabled."""
    store.remove_many(todo.entries)
    _uninstall(queue, store, todo.entries, todo.uninstalled)
    if todo.reenable:
        source.set_enabled(todo.reenable, True)
    return todo


def _uninstall(queue: DelayedQueue, store: EntryStore, names: Sequence[str],
               counts: dict[str, int]) -> None:
    wanted = set(names)
    gone = []
    for row in store.installed():
        if row.name in wanted:
            counts[row.name] = CronService(queue.with_kind(row.kind)).uninstall(
                key_prefix(row.name))
            gone.append(row.name)
    store.forget_installed(gone)
