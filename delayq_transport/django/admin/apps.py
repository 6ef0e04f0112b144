"""The admin app's configuration (label ``delayq_admin``: Django's own admin is ``admin``)."""

from __future__ import annotations

from django.apps import AppConfig


class DelayqAdminConfig(AppConfig):
    name = "delayq_transport.django.admin"
    label = "delayq_admin"
    verbose_name = "delayq"
    default_auto_field = "django.db.models.BigAutoField"
