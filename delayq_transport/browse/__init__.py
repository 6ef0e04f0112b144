"""See and manage individual tasks: the service shared by ``delayq tasks`` and ``delayq web``.

Message formats are pluggable (:func:`register_decoder`): Celery's is built in.
"""

from __future__ import annotations

from ..formats.decoders import DecodedMessage, Decoder, decode, register_decoder
from .filters import TaskFilter, decode_cursor, encode_cursor, parse_duration, parse_when
from .service import (
    ActionResult,
    TaskInFlight,
    TaskNotFound,
    TaskPage,
    TaskService,
    TaskView,
    Timeline,
)

__all__ = [
    "ActionResult", "DecodedMessage", "Decoder", "TaskFilter", "TaskInFlight", "TaskNotFound",
    "TaskPage", "TaskService", "TaskView", "Timeline", "decode", "decode_cursor",
    "encode_cursor", "parse_duration", "parse_when", "register_decoder",
]
