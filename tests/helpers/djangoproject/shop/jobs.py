"""The shop's handlers, imported by the worker ([worker] imports in settings.SCHEDULER)."""

from scheduler import Job
from scheduler.contrib.django import get_scheduler

from .models import Order

scheduler = get_scheduler()


@scheduler.handler("shop.send_receipt", retry_safe=True)
def send_receipt(job: Job) -> None:
    Order.objects.filter(pk=job.payload["order_id"]).update(receipt_sent=True)


@scheduler.handler("shop.tidy")
def tidy(job: Job) -> None:
    return None
