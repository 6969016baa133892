"""A Flask shop: an order is saved and its receipt e-mail enqueued in one transaction, and
the scheduler's worker runs inside the web process.

    pip install 'rerun-scheduler[postgres]' flask
    export DATABASE_URL=postgresql+psycopg://app@db.example/shop   # or sqlite:///shop.db
    scheduler migrate                     # with SCHEDULER_DATABASE_URL=$DATABASE_URL, at deploy
    python examples/flask_app.py 8000     # or gunicorn: see docs/howto/flask.md

``POST /orders {"item": "book"}`` writes the order and its job on the same SQLAlchemy
connection: both exist if and only if the transaction commits (``"fail": true`` raises after
the enqueue, so neither does). The receipt job sets ``receipt_sent`` (``GET /orders/<id>``).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from flask import Flask, abort, request
from sqlalchemy import (
    Boolean,
    Column,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    insert,
    select,
    update,
)

from scheduler import Job, Scheduler

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite:///shop.db")

scheduler = Scheduler(DATABASE_URL)  # the scheduler's tables, in the application's database
engine = create_engine(DATABASE_URL)  # the application's own engine, on the same database
metadata = MetaData()
orders = Table(
    "shop_orders",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("item", String(100), nullable=False),
    Column("receipt_sent", Boolean, nullable=False, default=False),
)


@scheduler.handler("shop.send_receipt", retry_safe=True)
def send_receipt(job: Job) -> None:
    with engine.begin() as conn:  # (the e-mail itself would be sent here)
        conn.execute(
            update(orders).where(orders.c.id == job.payload["order_id"]).values(receipt_sent=True)
        )


app = Flask(__name__)


class Failed(Exception):
    """Raised after the enqueue on purpose: the order and its job roll back together."""


@app.post("/orders")
def place_order() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    try:
        with engine.begin() as conn:  # commits on success, rolls back if anything raises
            order_id = conn.execute(
                insert(orders).values(item=body["item"], receipt_sent=False)
            ).inserted_primary_key[0]
            job_id = scheduler.enqueue("shop.send_receipt", {"order_id": order_id}, connection=conn)
            if body.get("fail"):
                raise Failed()
    except Failed:
        return {"error": "failed after the enqueue"}, 500
    return {"order_id": order_id, "job_id": job_id}, 201


@app.get("/orders/<int:order_id>")
def get_order(order_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(select(orders).where(orders.c.id == order_id)).first()
    if row is None:
        abort(404)
    return {"order_id": row.id, "item": row.item, "receipt_sent": row.receipt_sent}


def main(port: int) -> None:
    metadata.create_all(engine)  # the shop's own table (use your migrations instead)
    # The worker lives as long as the server: Ctrl-C ends app.run() (SIGTERM too, made to act
    # as Ctrl-C here), then the worker stops within its grace period.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with scheduler.background_worker(concurrency=2):
        app.run(host="127.0.0.1", port=port)
    scheduler.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8000)
