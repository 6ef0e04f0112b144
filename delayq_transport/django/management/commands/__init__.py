"""``manage.py delayq_worker`` (:mod:`.delayq_worker`)."""
