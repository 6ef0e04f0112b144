"""The admin app's configuration (label ``delayq_admin``: Django's own admin is ``admin``), and
its system check: the tables its pages read must be found from the settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class DelayqAdminConfig(AppConfig):
    name = "delayq_transport.django.admin"
    label = "delayq_admin"
    verbose_name = "delayq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(target_check)


def target_check(app_configs: Sequence[AppConfig] | None = None,
                 **kwargs: Any) -> list[checks.CheckMessage]:
    """``delayq_admin.E001``: the settings do not say where delayq's tables are (a wrong
    ``DELAYQ_DATABASE`` or ``DELAYQ_TABLE``). A delayq ``TASKS`` backend's options and
    database are its own checks' to report (``delayq.E001``, ``delayq.E007``): not twice."""
    from ..apps import delayq_task_aliases
    from ..target import target

    if delayq_task_aliases():
        return []
    try:
        target().url()
    except ImproperlyConfigured as exc:
        return [checks.Error(f"delayq's admin pages: {exc}", id="delayq_admin.E001")]
    return []
