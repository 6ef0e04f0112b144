"""The shop's one task: a receipt for an order, which it must find."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from .models import Order, Receipt, Tick


@shared_task(bind=True)
def send_receipt(self: Any, order_id: int) -> bool:
    """Record whether the order exists when the task runs. Published inside the order's
    ``atomic()`` block: with ``DELAYQ_JOIN_ATOMIC`` it runs after the commit (found), never
    for a rolled-back order; without it, before the commit (``DoesNotExist``) or for an order
    that was rolled back."""
    found = Order.objects.filter(pk=order_id).exists()
    Receipt.objects.create(order_id=order_id, found=found, task_id=self.request.id)
    return found


@shared_task(bind=True)
def tick(self: Any, label: str) -> str:
    """A periodic task's run, recorded with its occurrence's time: delayq beat's header, else
    (another scheduler) none."""
    header = getattr(self.request, "delayq_beat", None) or {}
    Tick.objects.create(label=label, task_id=self.request.id, at_ms=header.get("at_ms"))
    return label
