"""``delayq move-from``: a Redis or RabbitMQ broker's waiting Celery messages into delayq.

:mod:`.mover` holds the order of operations (and why a crash at any point loses or doubles
nothing), :mod:`.redis_source` and :mod:`.amqp_source` what each broker keeps where,
:mod:`.convert` the mapping from a source message to its row (the transport's own, in
:mod:`delayq_transport.formats.celery`), and :mod:`.cli` the command. It writes through
``DelayedQueue.offer_once`` (core/queue/once.py), never SQL of its own.
"""
