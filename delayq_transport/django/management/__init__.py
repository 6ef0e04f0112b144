"""Management commands of the delayq app: ``delayq_worker``."""
