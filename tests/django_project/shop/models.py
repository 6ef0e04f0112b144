from __future__ import annotations

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=100)
    created = models.DateTimeField(auto_now_add=True)


class Receipt(models.Model):
    """What ``send_receipt`` found when it ran: one row per run."""

    order_id = models.BigIntegerField()
    found = models.BooleanField()
    task_id = models.CharField(max_length=64)
    ran = models.DateTimeField(auto_now_add=True)


class Tick(models.Model):
    """One run of ``tick``: which schedule, which occurrence, when it ran (one row per run, so
    a duplicate run shows as two rows with one task id)."""

    label = models.CharField(max_length=100)
    task_id = models.CharField(max_length=64)
    at_ms = models.BigIntegerField(null=True)  # the occurrence's time (beat's header)
    ran = models.DateTimeField(auto_now_add=True)


class TaskRun(models.Model):
    """One run of a ``django.tasks`` task of shop/djtasks.py (Django 6 or the backport): which
    task, which result, which attempt, in which worker process. One row per run, so a
    duplicate run shows as two rows with one result id."""

    label = models.CharField(max_length=200)
    result_id = models.CharField(max_length=64)
    attempt = models.IntegerField()
    pid = models.IntegerField()
    ran = models.DateTimeField(auto_now_add=True)
