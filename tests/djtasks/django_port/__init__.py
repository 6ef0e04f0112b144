"""Django's own tests of its task framework, run against delayq's backend (test_django_port.py)."""
