"""``manage.py beat_admin ACTION NAME...``: the Django admin's bulk action on
django-celery-beat's periodic tasks (``enable_tasks``, ``disable_tasks``, ``toggle_tasks``),
posted through Django's test client by a logged-in superuser, as a person clicks it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.test import Client
from django_celery_beat.models import PeriodicTask


class Command(BaseCommand):
    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action")
        parser.add_argument("names", nargs="+")

    def handle(self, *args: Any, action: str, names: list[str], **options: Any) -> None:
        user, _ = User.objects.get_or_create(username="admin", defaults={
            "is_staff": True, "is_superuser": True})
        client = Client()
        client.force_login(user)
        pks = list(PeriodicTask.objects.filter(name__in=names).values_list("pk", flat=True))
        if len(pks) != len(names):
            raise CommandError(f"unknown task among {names}")
        response = client.post("/admin/django_celery_beat/periodictask/",
                               {"action": action, "_selected_action": pks, "index": 0},
                               follow=True)
        # The admin redirects to the change list after an action it ran.
        if response.status_code != 200 or not response.redirect_chain:
            raise CommandError(f"admin answered {response.status_code} without running "
                               f"{action!r}")
        self.stdout.write(f"{action}: {', '.join(names)}")
