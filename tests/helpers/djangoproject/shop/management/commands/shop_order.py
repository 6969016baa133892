"""``manage.py shop_order ITEM [--fail] [--trigger TASK] [--many N]``: in one atomic block, an
order, its receipt job (and N more jobs, and a trigger); ``--fail`` raises at the end, so the
block rolls back. Prints the ids written."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from scheduler.contrib.django import get_scheduler
from shop.models import Order


class Command(BaseCommand):
    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("item")
        parser.add_argument("--fail", action="store_true")
        parser.add_argument("--trigger")
        parser.add_argument("--many", type=int, default=0)

    def handle(self, *args: Any, **options: Any) -> None:
        scheduler = get_scheduler()
        written: dict[str, Any] = {}
        try:
            with transaction.atomic():
                order = Order.objects.create(item=options["item"])
                written["order"] = order.pk
                written["job"] = scheduler.enqueue("shop.send_receipt", {"order_id": order.pk})
                if options["many"]:
                    items = [{"handler": "shop.tidy"}] * options["many"]
                    written["many"] = scheduler.enqueue_many(items)
                if options["trigger"]:
                    scheduler.trigger(options["trigger"], reason="shop_order")
                self.stdout.write(json.dumps(written))
                if options["fail"]:
                    raise CommandError("failing on purpose: the block rolls back")
        finally:
            self.stdout.flush()
