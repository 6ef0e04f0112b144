"""RedBeat's entries for ``delayq beat import --from redbeat`` (see :mod:`.sources`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from celery.schedules import crontab

from delayq_transport.core import InvalidInput
from delayq_transport.core.db import mask_password
from delayq_transport.scheduling.carried import Carried, Refused
from delayq_transport.scheduling.schedules import Interval

from .carry import Item, celery_entry

# -- RedBeat -----------------------------------------------------------------------------------


@dataclass
class RedBeatSource:
    """RedBeat's entries in the Redis database at ``url`` under ``prefix``."""

    url: str
    prefix: str = "redbeat:"
    zone: tzinfo | None = None
    kind: str = "redbeat"
    cannot_disable: str | None = None

    def __post_init__(self) -> None:
        try:
            import redis
        except ImportError as exc:  # pragma: no cover - redbeat users have it
            raise InvalidInput("reading RedBeat needs the redis package: pip install redis") \
                from exc
        self.where = mask_password(self.url)
        self._redis = redis.Redis.from_url(self.url, decode_responses=True)

    def _keys(self) -> list[str]:
        return [str(k) for k in self._redis.zrange(f"{self.prefix}:schedule", 0, -1)]

    def read(self) -> list[Item]:
        statics = set(self._redis.smembers(f"{self.prefix}:statics"))
        out: list[Item] = []
        for key in self._keys():
            definition, meta = self._redis.hmget(key, "definition", "meta")
            name = key.removeprefix(self.prefix)
            if not definition:
                continue  # deleted between the two reads
            item = self._entry(name, str(definition), None if meta is None else str(meta))
            if isinstance(item, Carried) and item.name in statics:
                item = replace(item, notes=(*item.notes, "static entry of the app's "
                                            "beat_schedule: RedBeat rewrites it when it starts"))
            out.append(item)
        return out

    def _entry(self, name: str, definition: str, meta: str | None) -> Item:
        try:
            d = json.loads(definition, object_hook=_redbeat_value)
            m = json.loads(meta, object_hook=_redbeat_value) if meta else {}
        except Refused as exc:
            return Refused(name, exc.reason)
        except (ValueError, TypeError, KeyError) as exc:
            return Refused(name, f"RedBeat definition cannot be read: {exc}")
        sched = d.get("schedule")
        relative = isinstance(sched, _Relative)
        return celery_entry(str(d.get("name") or name), d.get("task"),
                            sched.interval if isinstance(sched, _Relative) else sched,
                            d.get("args"), d.get("kwargs"), d.get("options"),
                            enabled=bool(d.get("enabled", True)),
                            last_run_at=m.get("last_run_at"),
                            total_run_count=int(m.get("total_run_count") or 0),
                            zone=self.zone, relative=relative)

    def set_enabled(self, names: list[str], enabled: bool) -> list[str]:
        """RedBeat's own disable: the definition's ``enabled`` (its key, score and meta stay)."""
        import redis

        changed = []
        for name in names:
            key = self.prefix + name
            with self._redis.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(key)
                        raw = pipe.hget(key, "definition")
                        if not raw:
                            break
                        d = json.loads(raw)
                        if bool(d.get("enabled", True)) == enabled:
                            break
                        d["enabled"] = enabled
                        pipe.multi()
                        pipe.hset(key, "definition", json.dumps(d))
                        pipe.execute()
                        changed.append(name)
                        break
                    except redis.WatchError:
                        continue
        return changed

    def close(self) -> None:
        self._redis.close()


@dataclass(frozen=True)
class _Relative:
    interval: Interval


def _redbeat_value(d: dict[str, Any]) -> Any:
    """RedBeat's typed JSON values (``redbeat/decoder.py``) as delayq's; rrule is refused."""
    kind = d.get("__type__")
    if kind is None:
        return d
    if kind == "datetime":
        zone = d.get("timezone", "UTC")
        tz = timezone(timedelta(seconds=zone)) if isinstance(zone, int | float) \
            else ZoneInfo(str(zone))
        fields = {k: d[k] for k in ("year", "month", "day", "hour", "minute", "second",
                                    "microsecond")}
        return datetime(**fields, tzinfo=tz)
    if kind == "interval":
        interval = Interval.of(float(d["every"]))
        return _Relative(interval) if d.get("relative") else interval
    if kind == "crontab":
        return crontab(**{k: d[k] for k in ("minute", "hour", "day_of_week", "day_of_month",
                                            "month_of_year") if k in d})
    raise Refused("", f"RedBeat schedule type {kind!r} cannot be carried (delayq runs "
                      "intervals, crontabs, solar events and clocked instants)")


