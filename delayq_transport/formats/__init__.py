"""How messages are stored in ``delayed_queue`` rows, for every front end that reads or writes
them: :mod:`.celery` (kombu's virtual-transport message, queue and priority kinds),
:mod:`.dramatiq` (Dramatiq's kinds and payload decoder) and :mod:`.django_tasks` (Django's task
framework: kinds and payload). Below the adapters, above the core: the transport, beat, Spark,
Dramatiq, Django's tasks, the task listings, the web page and metrics all import these instead
of each other. No Celery or Dramatiq import (kombu's JSON encoder only).
"""
