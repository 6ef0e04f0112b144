"""``manage.py delayq_worker``, ``delayq_migrate``, ``delayq_prune``, ``delayq_health``."""
