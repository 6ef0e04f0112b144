"""Management commands of the delayq app: ``delayq_worker``, ``delayq_migrate``,
``delayq_prune`` and ``delayq_health`` (:mod:`.commands`); what the last three share:
:mod:`.base`."""
