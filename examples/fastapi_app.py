"""A FastAPI shop: an order is saved and its receipt e-mail enqueued in one transaction, and
the scheduler's worker runs inside the web process.

    pip install 'rerun-scheduler[postgres]' fastapi uvicorn
    export DATABASE_URL=postgresql+psycopg://app@db.example/shop   # or sqlite:///shop.db
    scheduler migrate                     # with SCHEDULER_DATABASE_URL=$DATABASE_URL, at deploy
    uvicorn examples.fastapi_app:app --workers 4

``POST /orders {"item": "book"}`` writes the order and its job with the same ``Session``: both
exist if and only if the transaction commits (``"fail": true`` raises after the enqueue, so
neither does). Each uvicorn worker process runs a background worker; the receipt job sets
``receipt_sent`` on the order (``GET /orders/{id}``). docs/howto/fastapi.md walks through it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import String, create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from scheduler import Job, Scheduler

DATABASE_URL = os.environ.get("DATABASE_URL", "sqlite:///shop.db")

scheduler = Scheduler(DATABASE_URL)  # the scheduler's tables, in the application's database
engine = create_engine(DATABASE_URL)  # the application's own engine, on the same database
Sessions = sessionmaker(engine)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100))
    receipt_sent: Mapped[bool] = mapped_column(default=False)


@scheduler.handler("shop.send_receipt", retry_safe=True)
def send_receipt(job: Job) -> None:
    with Sessions.begin() as session:  # (the e-mail itself would be sent here)
        order = session.get(Order, job.payload["order_id"])
        if order is not None:
            order.receipt_sent = True


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    Base.metadata.create_all(engine)  # the shop's own table (use your migrations instead)
    async with scheduler.background_worker(concurrency=2):  # stopped when the server stops
        yield
    scheduler.close()


app = FastAPI(lifespan=lifespan)


def session() -> Iterator[Session]:
    with Sessions() as opened:
        yield opened


class NewOrder(BaseModel):
    item: str
    fail: bool = False  # raise after the enqueue: the order and its job roll back together


@app.post("/orders", status_code=201)
def place_order(new: NewOrder, db: Annotated[Session, Depends(session)]) -> dict[str, Any]:
    with db.begin():  # commits on success, rolls back if anything below raises
        order = Order(item=new.item)
        db.add(order)
        db.flush()  # the order's id
        job_id = scheduler.enqueue("shop.send_receipt", {"order_id": order.id}, connection=db)
        if new.fail:
            raise HTTPException(status_code=500, detail="failed after the enqueue")
    return {"order_id": order.id, "job_id": job_id}


@app.get("/orders/{order_id}")
def get_order(order_id: int, db: Annotated[Session, Depends(session)]) -> dict[str, Any]:
    order = db.get(Order, order_id)
    if order is None:
        raise HTTPException(status_code=404, detail="no such order")
    return {"order_id": order.id, "item": order.item, "receipt_sent": order.receipt_sent}
