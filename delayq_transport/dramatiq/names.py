"""Dramatiq's kinds and payload decoder: :mod:`delayq_transport.formats.dramatiq`, re-exported
under the Dramatiq module's path."""

from __future__ import annotations

from ..formats.dramatiq import *  # noqa: F403
from ..formats.dramatiq import __all__ as __all__
