"""The due query reads one batch, not the whole burst.

A burst's rows share one ``next_run_at``. Each batch after the first goes on from the last
(next_run_at, id) it saw; the database must range-scan the due index from there and stop after
the batch, whatever the burst's size. Before revision 0007 the due index had no ``id`` and the
keyset was written as an OR: PostgreSQL read every due row and sorted them, once per batch
(a burst of 100,000 rows took minutes, mostly in those reads).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, text

from scheduler import Scheduler
from scheduler._store import due as _due

N = 3_000
BATCH = 100
AT = datetime(2030, 1, 1, tzinfo=UTC)


def _burst(app: Scheduler) -> None:
    from scheduler._store.tables import rows

    app.migrate()
    with app.store.begin() as conn:
        conn.execute(
            insert(rows),
            [
                {
                    "name": f"customer-{i:05d}",
                    "handler": "h",
                    "payload": "{}",
                    "cron": "0 * * * *",
                    "timezone": "UTC",
                    "concurrent": False,
                    "enabled": True,
                    "next_run_at": AT,
                    "consecutive_failures": 0,
                    "version": 1,
                    "created_at": AT,
                    "updated_at": AT,
                }
                for i in range(N)
            ],
        )
    with app.store.engine.connect() as conn:
        conn.execute(
            text("ANALYZE TABLE scheduler_rows" if conn.dialect.name == "mysql" else "ANALYZE")
        )
        conn.commit()


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found += _nodes(child)
    return found


def _late_batch(app: Scheduler) -> tuple[datetime, tuple[datetime, int]]:
    now = AT + timedelta(seconds=30)
    with app.store.read() as conn:
        middle = conn.execute(text("SELECT min(id) + :half FROM scheduler_rows"), {"half": N // 2})
        after = (AT, int(middle.scalar_one()))
    # What the tick reads there: the 100 rows after it, in (next_run_at, id) order.
    with app.store.engine.connect() as conn:
        batch = _due.due(app.store, conn, now, BATCH, after)
    assert [r.id for r in batch] == list(range(after[1] + 1, after[1] + 1 + BATCH))
    assert {r.next_run_at for r in batch} == {AT}  # read back as the aware instant
    return now, after


def test_a_late_batch_of_a_burst_reads_only_its_rows(app: Scheduler) -> None:
    """Half-way through a burst of 3,000 rows due at one instant, the next batch of 100 reads
    about 100 index entries: no sort, no entry read before the batch's."""
    _burst(app)
    now, after = _late_batch(app)
    dialect = app.store.engine.dialect.name
    statement = _due._KEYSET.get(dialect, _due._DUE_AFTER_TWO)
    params = {"p_now": now, "p_limit": BATCH, "p_after_at": AT, "p_after_id": after[1]}
    naive = {k: v.replace(tzinfo=None) if isinstance(v, datetime) else v for k, v in params.items()}
    with app.store.engine.connect() as conn:
        if dialect == "postgresql":
            sql = statement.compile(dialect=conn.dialect).construct_expanded_state(params)
            [[found]] = conn.exec_driver_sql(
                f"EXPLAIN (ANALYZE, FORMAT JSON) {sql.statement}", naive
            ).all()
            plan = (json.loads(found) if isinstance(found, str) else found)[0]["Plan"]
            nodes = _nodes(plan)
            scans = [n for n in nodes if n.get("Relation Name") == "scheduler_rows"]
            assert [n["Node Type"] for n in scans] == ["Index Scan"], plan
            assert scans[0]["Index Name"] == "ix_scheduler_rows_due", plan
            assert "ROW(" in scans[0]["Index Cond"], plan  # the keyset positions the scan
            assert scans[0]["Actual Rows"] <= BATCH, plan
            assert not [n for n in nodes if n["Node Type"] in ("Sort", "Incremental Sort")], plan
        elif dialect == "sqlite":
            # SQLite counts its virtual machine's instructions: the late batch costs about
            # what the first one does (on the OR form it cost 20 times as much here).
            raw = conn.connection.driver_connection
            assert raw is not None

            def steps(after_: tuple[datetime, int] | None) -> int:
                count = [0]

                def tick() -> int:
                    count[0] += 1
                    return 0

                raw.set_progress_handler(tick, 100)
                try:
                    found = _due.due(app.store, conn, now, BATCH, after_)
                finally:
                    raw.set_progress_handler(None, 100)
                assert len(found) == BATCH
                return count[0]

            first, late = steps(None), steps(after)
            assert late <= 3 * first, (first, late)
        else:  # MariaDB: the handler's reads of index entries
            conn.exec_driver_sql("FLUSH STATUS")
            conn.execute(statement, params).all()
            reads = dict(conn.execute(text("SHOW SESSION STATUS LIKE 'Handler_read%'")).all())
            assert int(reads["Handler_read_next"]) <= BATCH + 10, reads
