"""The Django project of the django.tasks systems: settings (``djapp.settings``) and the
tasks (``djapp.tasks``); ``BENCH_DJANGO_BACKEND`` picks the backend."""
