"""The kombu transport: Celery's ``delayq+postgresql://`` broker on the queue core.

``delayq_transport.transport:Transport`` is the class kombu loads for the ``delayq`` alias
(see :mod:`.transport` for its features, connection string and options); :mod:`.message`
encodes Celery's messages into rows and back.
"""

from __future__ import annotations

from .transport import DelayqChannel, Transport

__all__ = ["DelayqChannel", "Transport"]
