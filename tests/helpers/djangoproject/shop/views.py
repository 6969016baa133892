import json

from django.db import transaction
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from scheduler.contrib.django import get_scheduler

from .models import Order


class Failed(Exception):
    """Raised after the enqueue on purpose: the order and its job roll back together."""


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    try:
        with transaction.atomic():
            order = Order.objects.create(item=body["item"])
            # No connection= : inside atomic() the job is written on Django's connection.
            job_id = get_scheduler().enqueue("shop.send_receipt", {"order_id": order.pk})
            if body.get("fail"):
                raise Failed()
    except Failed:
        return JsonResponse({"error": "failed after the enqueue"}, status=500)
    return JsonResponse({"order_id": order.pk, "job_id": job_id}, status=201)


def get_order(request: HttpRequest, order_id: int) -> JsonResponse:
    order = Order.objects.filter(pk=order_id).first()
    if order is None:
        raise Http404("no such order")
    return JsonResponse({"order_id": order.pk, "receipt_sent": order.receipt_sent})
