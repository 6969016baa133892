"""A handler that writes its result to its own table guarded by its fence, then records its
success with ``job.complete`` in the same transaction (tests/worker/test_fences.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Integer, MetaData, String, Table, update

from scheduler import LeaseLost, Scheduler

effects_metadata = MetaData()
effects = Table(
    "fenced_effects",
    effects_metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("owner", String(40), nullable=False),
    Column("fence", Integer, nullable=False),
)


def effect_handler(app: Scheduler, owner: str, markers: Path) -> Any:
    """The handler both workers run: the first attempt stalls until ``go`` exists; each writes
    its result guarded by its fence, then completes in the same transaction."""

    @app.handler("effect", retry_safe=True, max_attempts=3)
    def effect(job: Any) -> None:
        if job.fence == 1:
            (markers / "started").touch()
            while not (markers / "go").exists():
                time.sleep(0.02)
        result = "completed"
        with app.store.engine.begin() as conn:
            changed = conn.execute(
                update(effects)
                .where(effects.c.id == 1, effects.c.fence < job.fence)
                .values(owner=owner, fence=job.fence)
            ).rowcount
            try:
                job.complete(connection=conn)
            except LeaseLost:
                result = "lease_lost"
                raise
            finally:
                with (markers / "results").open("a") as out:
                    out.write(f"{owner} {job.fence} {changed} {result}\n")

    return effect
