"""The kombu transport's message format: :mod:`delayq_transport.formats.celery`, re-exported
under the transport's public path (``delayq_transport.transport.message``)."""

from __future__ import annotations

from ..formats.celery import *  # noqa: F403
from ..formats.celery import __all__ as __all__
