"""An application's own table (``app_orders``), beside the scheduler's in the same database:
what the caller's-transaction tests write together with a job."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, String, Table

app_metadata = MetaData()
orders = Table(
    "app_orders",
    app_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("item", String(100), nullable=False),
)
