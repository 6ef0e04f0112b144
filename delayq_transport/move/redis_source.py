"""Celery's messages on Redis, as kombu's Redis transport keeps them.

Where kombu puts them (``kombu/transport/redis.py``):

* a queue ``q`` is a list per priority bucket: ``q`` for 0, ``q\\x06\\x16<n>`` for the others;
  producers ``LPUSH``, consumers ``BRPOP`` (the right end is the oldest message);
* a message a consumer took is kept in the ``unacked`` hash (delivery tag -> JSON of
  ``[message, exchange, routing_key]``, indexed by fetch time in ``unacked_index``) until its
  ack; a worker killed with SIGKILL leaves it there, and kombu gives it back only after
  ``visibility_timeout`` (Celery: 1 h, often raised to 12 h for long countdowns), under the
  ``unacked_mutex`` lock;
* bindings are sets ``_kombu.binding.<exchange>`` of
  ``routing_key\\x06\\x16pattern\\x06\\x16queue``.

Consumers show in ``CLIENT LIST`` on the queue's database: a kombu consumer's dedicated
connection has a blocking list pop (``BRPOP``) as its last command, idle or busy.

The move stages: ``LMOVE q delayq-move:staged:q RIGHT LEFT`` takes the oldest messages into a
list of its own (no consumer reads it, a crash keeps it), and once delayq holds them one
``MULTI``/``EXEC`` trims them off the staging list and sets the refused ones aside in
``delayq-move:refused:q``, from which they go back to the consuming end of ``q``. Dead workers'
``unacked`` entries move to the staging list in one ``MULTI``/``EXEC`` each (``WATCH unacked``,
as kombu's own restore does). The keys the move creates are its own, and empty when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ..formats import celery as celery_message
from .convert import SourceMessage, from_kombu_json
from .source import Batch, Leftover, MoveRefused, SourceCounts

SEP = "\x06\x16"
STAGED = "delayq-move:staged:"
REFUSED = "delayq-move:refused:"
CLIENT_NAME = "delayq-move-from"
BINDINGS = "_kombu.binding."
#: Celery's own exchanges: remote control and events, not tasks.
INTERNAL_EXCHANGES = frozenset({"celery.pidbox", "reply.celery.pidbox", "celeryev"})
UNACKED, UNACKED_INDEX, UNACKED_MUTEX = "unacked", "unacked_index", "unacked_mutex"
#: A client whose last command takes from a list is consuming (kombu: BRPOP; scripts: RPOP).
CONSUMING = frozenset({"brpop", "blpop", "brpoplpush", "blmove", "blmpop", "rpop", "lpop",
                       "rpoplpush", "lmove", "lmpop"})
#: Priority-bucket lists of a queue: kombu names them after the bucket, one of 0-9.
BUCKETS = range(1, 10)
#: unacked entries moved per MULTI/EXEC.
RESTORE_CHUNK = 200
READ_CHUNK = 1000


def lists_of(queue: str) -> list[str]:
    return [queue] + [f"{queue}{SEP}{n}" for n in BUCKETS]


def queue_of_list(name: str) -> str:
    return name.rsplit(SEP, 1)[0] if SEP in name else name


class RedisSource:
    """One Redis database as a source; the move's connections are named ``CLIENT_NAME:...``."""

    can_preview = True

    def __init__(self, url: str, display: str) -> None:
        try:
            import redis
        except ImportError as exc:  # redis-py comes with celery[redis]; delayq needs it only here
            raise MoveRefused("moving from Redis needs redis-py: "
                              "pip install 'delayq[move]'") from exc
        self.display = display
        self.errors: tuple[type[BaseException], ...] = (redis.RedisError,)
        self.name = f"{CLIENT_NAME}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.client: Any = redis.Redis.from_url(url, client_name=self.name)
        self.db = int(self.client.connection_pool.connection_kwargs.get("db") or 0)
        try:
            self.client.ping()
        except redis.RedisError as exc:
            raise MoveRefused(f"cannot reach {display}: {exc}") from exc
        self._bindings: dict[str, list[tuple[str, str, str]]] | None = None

    def close(self) -> None:
        self.client.close()

    # -- what is there -------------------------------------------------------------------

    def bindings(self) -> dict[str, list[tuple[str, str, str]]]:
        """exchange -> (routing key, pattern, queue) of every kombu binding, internals aside."""
        if self._bindings is None:
            self._bindings = {}
            for key in self.client.scan_iter(match=BINDINGS + "*", count=1000):
                exchange = key.decode()[len(BINDINGS):]
                if exchange in INTERNAL_EXCHANGES:
                    continue
                members = [m.decode().split(SEP) for m in self.client.smembers(key)]
                self._bindings[exchange] = [(m[0], m[1], m[2]) for m in members if len(m) == 3]
        return self._bindings

    def _own_lists(self, prefix: str) -> list[str]:
        return sorted(k.decode()[len(prefix):]
                      for k in self.client.scan_iter(match=prefix + "*", count=1000))

    def queues(self, wanted: Sequence[str]) -> list[str]:
        """``wanted``, or every bound queue; plus any queue an interrupted move left staged."""
        found = set(wanted) or {q for rows in self.bindings().values() for _, _, q in rows}
        if not wanted:
            found |= {q for q, _, _ in self._unacked() if q is not None}
        found |= {queue_of_list(n) for p in (STAGED, REFUSED) for n in self._own_lists(p)}
        return sorted(found)

    def blockers(self, queues: Sequence[str]) -> list[str]:
        import redis

        try:
            clients = self.client.client_list()
        except redis.ResponseError as exc:  # a managed Redis may rename or forbid it
            raise MoveRefused(f"cannot list the clients of {self.display} ({exc}), so cannot "
                              "check that no worker consumes it; nothing was moved") from exc
        out = []
        for c in clients:
            name = c.get("name", "")
            if str(c.get("db")) != str(self.db) or name == self.name:
                continue
            where = f"client id={c.get('id')} addr={c.get('addr')} connected {c.get('age')} s"
            if name.startswith(CLIENT_NAME):
                out.append(f"another delayq move-from is running on this database ({where})")
            elif c.get("cmd") in CONSUMING:
                label = f" name={name}" if name else ""
                out.append(f"a consumer: {where}{label}, last command {c.get('cmd')} "
                           f"{c.get('idle')} s ago")
        return out

    def counts(self, queues: Sequence[str]) -> dict[str, SourceCounts]:
        unacked: dict[str | None, int] = {}
        for queue, _, _ in self._unacked():
            unacked[queue] = unacked.get(queue, 0) + 1
        return {q: self._counts(q, unacked.get(q, 0)) for q in queues}

    def _counts(self, queue: str, unacked: int) -> SourceCounts:
        lists = lists_of(queue)
        with self.client.pipeline(transaction=False) as pipe:
            for name in lists:
                pipe.llen(name)
            for name in lists:
                pipe.llen(STAGED + name)
                pipe.llen(REFUSED + name)
            sizes = pipe.execute()
        waiting = sum(sizes[: len(lists)]) + sum(sizes[len(lists) + 1 :: 2])
        return SourceCounts(waiting, unacked, sum(sizes[len(lists) :: 2]))

    def leftovers(self) -> list[Leftover]:
        return [Leftover("?", f"unacked {tag}", why) for q, tag, why in self._unacked()
                if q is None]

    def _unacked(self) -> list[tuple[str | None, str, str]]:
        """(queue, delivery tag, reason if no queue) of every ``unacked`` entry."""
        out = []
        for tag, raw in self.client.hscan_iter(UNACKED, count=1000):
            queue, why = self._route(raw)
            out.append((queue, tag.decode(), why))
        return out

    def _route(self, raw: bytes) -> tuple[str | None, str]:
        """The one queue an ``unacked`` entry came from, as kombu's restore would find it."""
        try:
            _, exchange, routing_key = json.loads(raw)
        except (ValueError, TypeError):
            return None, "not an entry kombu wrote ([message, exchange, routing key])"
        if not exchange:
            return (routing_key, "") if routing_key else (None, "no routing key")
        queues = {q for rk, pattern, q in self.bindings().get(exchange, [])
                  if (re.match(pattern, routing_key or "") if pattern else rk == routing_key)}
        if len(queues) == 1:
            return queues.pop(), ""
        return None, (f"exchange {exchange!r} routing key {routing_key!r} leads to "
                      f"{len(queues)} queues ({', '.join(sorted(queues)) or 'none bound'}); "
                      "left in unacked")

    # -- dead workers' messages ------------------------------------------------------------

    def restore_unacked(self, queues: Sequence[str]) -> dict[str, int]:
        import redis

        wanted = set(queues)
        tags = [tag for q, tag, _ in self._unacked() if q in wanted]
        restored: dict[str, int] = {}
        if not tags:
            return restored
        lock = self.client.lock(UNACKED_MUTEX, timeout=300, blocking=False)
        if not lock.acquire():
            ttl = self.client.ttl(UNACKED_MUTEX)
            raise MoveRefused(f"{UNACKED_MUTEX} is held: a kombu worker is restoring unacked "
                              f"messages right now (or was killed doing so: it expires in "
                              f"{ttl} s). Run again once no worker is left")
        try:
            for start in range(0, len(tags), RESTORE_CHUNK):
                for queue, n in self._restore(tags[start : start + RESTORE_CHUNK]).items():
                    restored[queue] = restored.get(queue, 0) + n
        finally:
            with contextlib.suppress(redis.exceptions.LockError):  # expired: nothing to free
                lock.release()
        return restored

    def _restore(self, tags: list[str]) -> dict[str, int]:
        """Move these entries into their staging lists, atomically (retried if unacked moved)."""
        import redis

        while True:
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(UNACKED)
                    values = pipe.hmget(UNACKED, tags)
                    pipe.multi()
                    moved: dict[str, int] = {}
                    for tag, raw in zip(tags, values, strict=True):
                        queue = self._route(raw)[0] if raw is not None else None
                        if queue is None:
                            continue  # acked meanwhile, or no queue: left where it is
                        message = json.loads(raw)[0]
                        priority = (message.get("properties") or {}).get("priority")
                        name = celery_message.kind_for(queue, priority)  # kombu's own list
                        pipe.lpush(STAGED + name, json.dumps(message))
                        pipe.hdel(UNACKED, tag)
                        pipe.zrem(UNACKED_INDEX, tag)
                        moved[queue] = moved.get(queue, 0) + 1
                    pipe.execute()
                    return moved
                except redis.WatchError:
                    continue

    # -- moving ----------------------------------------------------------------------------

    def preview(self, queue: str) -> Iterator[SourceMessage]:
        for name in lists_of(queue):
            for key in (STAGED + name, REFUSED + name, name):
                for start in range(0, self.client.llen(key), READ_CHUNK):
                    for raw in self.client.lrange(key, start, start + READ_CHUNK - 1):
                        yield from_kombu_json(queue, raw)
        for _, raw in self.client.hscan_iter(UNACKED, count=1000):
            if self._route(raw)[0] == queue:
                try:
                    message = json.dumps(json.loads(raw)[0])
                except (ValueError, TypeError, IndexError):
                    continue
                yield from_kombu_json(queue, message)

    def batches(self, queue: str, size: int) -> Iterator[Batch]:
        """Per list of the queue: what a previous run staged, then the list, oldest first."""
        for name in lists_of(queue):
            staged = STAGED + name
            while True:
                raws = self.client.lrange(staged, -size, -1)
                if not raws:
                    with self.client.pipeline(transaction=False) as pipe:
                        for _ in range(size):
                            pipe.lmove(name, staged, "RIGHT", "LEFT")
                        if not any(r is not None for r in pipe.execute()):
                            break
                    continue
                raws.reverse()  # oldest first
                yield Batch(name, [from_kombu_json(queue, r) for r in raws], raws)

    def settle(self, batch: Batch, keep: Sequence[int]) -> None:
        with self.client.pipeline(transaction=True) as pipe:
            for i in keep:
                pipe.lpush(REFUSED + batch.where, batch.handles[i])
            pipe.ltrim(STAGED + batch.where, 0, -(len(batch.handles) + 1))
            pipe.execute()

    def finish(self, queue: str) -> None:
        """Refused messages go back to the consuming end of their list, in their order."""
        for name in lists_of(queue):
            while self.client.lmove(REFUSED + name, name, "LEFT", "RIGHT") is not None:
                pass
