"""Celery's messages on RabbitMQ (kombu's py-amqp transport).

RabbitMQ keeps what the move needs to be safe: a message taken with ``basic_get`` and not
acknowledged stays the broker's, out of every other consumer's reach, and returns to its queue
when the channel closes, however the mover ends. So a batch is up to N ``basic_get`` without
ack; once delayq holds them, ``basic_ack`` removes them (followed by a synchronous call on the
same channel: the broker handles a channel's frames in order, so the acks are done when it
answers). Messages the move refuses stay unacknowledged until their queue is done, then
``basic_reject(requeue=True)`` puts them back.

A dead worker's unacknowledged messages are already back in their queue: RabbitMQ requeues
them when its connection closes. A passive ``queue_declare`` gives each queue's
``consumer_count``: a live consumer (a worker, or anything consuming) holds its prefetched
messages, and the move refuses to start. RabbitMQ cannot list queues over AMQP, so they are
named (``--queue``; ``celery`` by default), and it cannot show a message without taking it, so a
dry run shows counts only. One move runs per virtual host at a time: it holds an exclusive
queue ``delayq-move-from.lock`` (removed by the broker with the mover's connection).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .convert import SourceMessage, from_amqp
from .source import Batch, Leftover, MoveRefused, SourceCounts

LOCK_QUEUE = "delayq-move-from.lock"
#: AMQP reply codes of the channel errors the move expects.
NOT_FOUND, RESOURCE_LOCKED = 404, 405
DEFAULT_QUEUES = ("celery",)


class AmqpSource:
    """One RabbitMQ virtual host as a source."""

    can_preview = False

    def __init__(self, url: str, display: str) -> None:
        from kombu import Connection

        self.display = display
        self.connection: Any = Connection(url)
        #: py-amqp's errors, through kombu (a channel error carries the AMQP reply code).
        self.errors: tuple[type[BaseException], ...] = (
            *self.connection.connection_errors, *self.connection.channel_errors)
        try:
            self.connection.connect()
        except self.errors as exc:
            raise MoveRefused(f"cannot reach {display}: {exc}") from exc
        self.vhost = self.connection.virtual_host
        self.channel: Any = self._open_channel()
        self._held: list[int] = []
        self._lock()

    def _open_channel(self) -> Any:
        channel = self.connection.connection.channel()
        channel.auto_decode = False  # the body as sent: py-amqp would decode it to str
        return channel

    def _lock(self) -> None:
        try:
            self.channel.queue_declare(LOCK_QUEUE, exclusive=True, auto_delete=True)
        except self.connection.channel_errors as exc:
            if getattr(exc, "reply_code", None) != RESOURCE_LOCKED:
                raise
            self.close()
            raise MoveRefused(f"another delayq move-from is running on virtual host "
                              f"{self.vhost!r} (it holds queue {LOCK_QUEUE!r})") from exc

    def close(self) -> None:
        self.connection.release()  # unacknowledged messages return to their queues

    def queues(self, wanted: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(wanted or DEFAULT_QUEUES))

    def _declare(self, queue: str) -> tuple[int, int]:
        """(ready messages, consumers) of a queue; MoveRefused if it does not exist."""
        try:
            ok = self.channel.queue_declare(queue, passive=True)
        except self.connection.channel_errors as exc:
            if getattr(exc, "reply_code", None) != NOT_FOUND:
                raise
            self.channel = self._open_channel()  # the error closed it
            raise MoveRefused(f"queue {queue!r} does not exist on virtual host {self.vhost!r} "
                              "(name the queues to move with --queue)") from exc
        return int(ok.message_count), int(ok.consumer_count)

    def blockers(self, queues: Sequence[str]) -> list[str]:
        out = []
        for queue in queues:
            consumers = self._declare(queue)[1]
            if consumers:
                out.append(f"queue {queue!r} has {consumers} consumer(s) (`rabbitmqctl "
                           f"list_consumers -p {self.vhost}` names their connections)")
        return out

    def counts(self, queues: Sequence[str]) -> dict[str, SourceCounts]:
        return {q: SourceCounts(self._declare(q)[0]) for q in queues}

    def leftovers(self) -> list[Leftover]:
        return []

    def restore_unacked(self, queues: Sequence[str]) -> dict[str, int]:
        return {}  # RabbitMQ requeued them when the dead worker's connection closed

    def preview(self, queue: str) -> Iterator[SourceMessage]:
        return iter(())

    def batches(self, queue: str, size: int) -> Iterator[Batch]:
        while True:
            batch = Batch(queue, [])
            while len(batch.items) < size:
                message = self.channel.basic_get(queue, no_ack=False)
                if message is None:
                    break
                batch.items.append(from_amqp(queue, message.body, message.properties,
                                             message.delivery_info))
                batch.handles.append(message.delivery_tag)
            if not batch.items:
                return
            yield batch

    def settle(self, batch: Batch, keep: Sequence[int]) -> None:
        kept = set(keep)
        for i, tag in enumerate(batch.handles):
            if i in kept:
                self._held.append(tag)
            else:
                self.channel.basic_ack(tag)
        self._declare(batch.where)  # answered once the broker has handled the acks before it

    def finish(self, queue: str) -> None:
        for tag in self._held:
            self.channel.basic_reject(tag, requeue=True)
        self._held.clear()
        self._declare(queue)
