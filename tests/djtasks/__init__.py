"""Django's task framework on delayq, Django 6's and the django-tasks backport (see conftest.py)."""
