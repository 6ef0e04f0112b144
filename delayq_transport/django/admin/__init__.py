"""delayq in the Django admin: ``INSTALLED_APPS += ["delayq_transport.django.admin"]`` (with
``django.contrib.admin`` and ``delayq_transport.django``). Its models are
:mod:`.models`, its pages :mod:`.admin`; docs/how-to/django-admin.md says what it shows.

Nothing is imported here: Django's admin imports ``<app>.admin`` of every installed app, so
with ``delayq_transport.django`` installed this package is imported as that app's admin
module, and it must then do nothing.
"""
