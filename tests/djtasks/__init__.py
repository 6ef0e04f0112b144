"""Django 6's task framework on delayq (see conftest.py)."""
