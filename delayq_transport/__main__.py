"""``python -m delayq_transport`` is the ``delayq`` command."""

from .cli import main

main()
