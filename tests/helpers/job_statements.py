"""A job's INSERT with every value a bound parameter, and one set of those values: the
statement the driver and the PostgreSQL spread tests run."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import bindparam, insert

from scheduler._store.tables import UTCDateTime, jobs

NOW = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

INSERT = insert(jobs).values(
    handler=bindparam("p_handler", type_=jobs.c.handler.type),
    payload=bindparam("p_payload", type_=jobs.c.payload.type),
    queue=bindparam("p_queue", type_=jobs.c.queue.type),
    priority=bindparam("p_priority", type_=jobs.c.priority.type),
    run_at=bindparam("p_now", type_=UTCDateTime()),
    state=bindparam("p_state", type_=jobs.c.state.type),
    attempts=bindparam("p_attempts", type_=jobs.c.attempts.type),
    max_attempts=bindparam("p_attempts", type_=jobs.c.max_attempts.type),
    created_at=bindparam("p_now", type_=UTCDateTime()),
)
