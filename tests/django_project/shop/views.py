"""The view a customer calls: an order and its receipt task, in one ``atomic()`` block, as a
Django user writes it (no delayq code here)."""

from __future__ import annotations

import time

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .models import Order
from .tasks import send_receipt


class Declined(Exception):
    """The order is rolled back after its task was published."""


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    """POST ``item``; ``linger`` (seconds of work after the publish, before the commit),
    ``countdown`` (the receipt's), ``decline=1`` (roll the order back), ``on_commit=1``
    (publish after the commit instead, Celery's advice for brokers outside the database)."""
    order_id = None
    try:
        with transaction.atomic():
            order = Order.objects.create(item=request.POST.get("item", "thing"))
            order_id = order.pk
            countdown = float(request.POST.get("countdown", 0))
            if request.POST.get("on_commit") == "1":
                pk = order.pk
                transaction.on_commit(lambda: send_receipt.apply_async((pk,),
                                                                       countdown=countdown))
            elif countdown:
                send_receipt.apply_async((order.pk,), countdown=countdown)
            else:
                send_receipt.delay(order.pk)
            time.sleep(float(request.POST.get("linger", 0)))
            if request.POST.get("decline") == "1":
                raise Declined()
    except Declined:
        return JsonResponse({"order": order_id, "committed": False})
    return JsonResponse({"order": order_id, "committed": True})
