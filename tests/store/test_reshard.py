"""``migrate --reshard`` (``Scheduler.reshard``): every row moved from the shards the database
has to those the file asks, none lost or doubled, each in its routed shard; a failure halfway
leaves every row once and a rerun finishes; live workers, claimed jobs, other engines and a
layout that already fits are refused or left alone, nothing written.

Real PostgreSQL (directly and through PgBouncer: the ``shards_url`` fixture, and
``sharded_url``'s migrated 4 shards where a test starts from them), real rows made
through the public API (tasks of many tenants, jobs queued, succeeded and aborted with their
runs, decisions and audit entries, paused queues, handlers' settings, workers' presence).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from scheduler import Scheduler, SchedulerError, TaskSpec
from scheduler._errors import ConfigError, SchemaOutdated
from scheduler._model.handlers import Registry
from scheduler._store import handlers as _handlers
from scheduler._store import shards as _shards
from scheduler._store.reshard import MARKER, ROUTED, SHARED
from scheduler._store.status import health as _health
from scheduler._store.tables import metadata
from scheduler.testing import ManualClock

TENANTS = ["acme", "globex", "initech", "wayne", "cyberdyne", "wonka", "umbrella", "pied", None]


def registry() -> Registry:
    reg = Registry()
    reg.handler("t.ok", max_attempts=1)(lambda job: None)

    def boom(job: Any) -> None:
        raise RuntimeError("boom")

    reg.handler("t.boom", max_attempts=1)(boom)
    reg.handler("t.later")(lambda job: None)
    return reg


_OPENED: list[Scheduler] = []


@pytest.fixture(autouse=True)
def _close() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def make(url: str, shards: int, clock: ManualClock | None = None) -> Scheduler:
    app = Scheduler(url, shards=shards, registry=registry(), clock=clock or now_clock())
    _OPENED.append(app)
    return app


def now_clock() -> ManualClock:
    return ManualClock(datetime.now(UTC).replace(microsecond=0))


def populate(app: Scheduler, round_: int) -> None:
    """Tasks of many tenants triggered and run (succeeded, aborted), disabled, enabled; jobs of
    no task, queued for later, some of a tenant, one with a dedupe key; a job cancelled;
    a paused queue; a stale worker presence row."""
    for n in range(16):
        tenant = TENANTS[n % len(TENANTS)]
        handler = "t.boom" if n % 5 == 0 else "t.ok"
        app.put_task(
            TaskSpec(f"task-{round_}-{n}", "0 3 * * *", handler, tenant=tenant, payload={"n": n})
        )
        app.trigger(f"task-{round_}-{n}", reason="test", actor="tester")
    app.tick()
    assert app.work() == 16
    for n in range(0, 16, 4):
        app.disable(f"task-{round_}-{n}", reason="reshard test", actor="tester")
        app.enable(f"task-{round_}-{n}", actor="tester")
    later = app.clock() + timedelta(days=1)
    for n in range(12):
        app.enqueue("t.later", {"n": n}, run_at=later, tenant=TENANTS[n % len(TENANTS)])
    app.enqueue("t.later", {"k": round_}, run_at=later, dedupe_key=f"once-{round_}")
    cancelled = app.enqueue("t.later", {"cancel": True}, run_at=later)
    app.cancel_job(cancelled, reason="not needed", actor="tester")
    app.pause_queue(f"q{round_}", reason="maintenance", actor="tester")
    for index, shard in enumerate(app.shards):  # a worker stopped long ago, in each shard
        seen = app.clock() - timedelta(hours=1, minutes=index)
        _health.touch(shard.store, f"old:{round_}", seen, None)
        found = [(f"h.{round_}.{index}", "default", 3, False), ("t.ok", "default", 1, False)]
        _handlers.record(shard.store, found, now=seen, worker_id=f"old:{round_}")
        with shard.store.begin() as conn:  # a limit's lock row, and its holds (as a claim
            conn.execute(  # under [[limits]] writes them): of the shard's jobs, and of none
                text(
                    "INSERT INTO scheduler_limits (name, version) VALUES ('api', :v),"
                    f" ('l{round_}', 1) ON CONFLICT DO NOTHING"
                ),
                {"v": round_},
            )
            conn.execute(
                text(
                    "INSERT INTO scheduler_limit_holds (limit_name, part, job_id, started_at)"
                    " SELECT 'api', coalesce(tenant, ''), id, created_at FROM scheduler_jobs"
                    " UNION ALL SELECT 'api', 'gone', 10000000 + :r, :now"
                ),
                {"r": round_ * 10 + index, "now": seen},
            )


def schemas(app: Scheduler) -> list[str]:
    with app.store.read() as conn:
        own = str(conn.execute(text("SELECT current_schema()")).scalar_one())
        found = [_shards.schema_name(i) for i in _shards.found_shards(conn)]
        base = conn.execute(
            text("SELECT to_regclass(:t)"), {"t": f"{own}.scheduler_alembic_version"}
        ).scalar()
    return ([own] if base else []) + found


def snapshot(app: Scheduler) -> dict[str, list[tuple[str, tuple[Any, ...]]]]:
    """Every row of every table in every schema holding the scheduler's tables:
    table -> [(schema, row)]."""
    found: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
    with app.store.read() as conn:
        for schema in schemas(app):
            for name in [t.name for t in ROUTED] + list(SHARED):
                columns = ", ".join(c.name for c in metadata.tables[name].columns)
                for row in conn.execute(text(f"SELECT {columns} FROM {schema}.{name}")):
                    found.setdefault(name, []).append((schema, tuple(row)))
    return found


def routed_rows(snap: dict[str, list[tuple[str, tuple[Any, ...]]]]) -> Counter[tuple[str, Any]]:
    """The routed tables' rows, whatever their shard: each must be there exactly once."""
    names = [t.name for t in ROUTED]
    return Counter((name, row) for name in names for _, row in snap.get(name, []))


def check_placement(snap: dict[str, list[tuple[str, tuple[Any, ...]]]], count: int) -> None:
    """Each task, job, run, decision and audit entry sits in its routed shard."""
    cols = {name: [c.name for c in metadata.tables[name].columns] for name in snap}

    def where(schema: str) -> int:
        return int(schema.removeprefix(_shards.SCHEMA_PREFIX)) if count > 1 else 0

    def field(name: str, row: tuple[Any, ...], column: str) -> Any:
        return row[cols[name].index(column)]

    task_shard: dict[str, int] = {}
    for schema, row in snap["scheduler_rows"]:
        key = _shards.routing_key(field("scheduler_rows", row, "tenant"), row[1])
        assert where(schema) == _shards.shard_of(key, count), row[1]
        task_shard[row[1]] = where(schema)
    job_shard: dict[int, int] = {}
    for schema, row in snap["scheduler_jobs"]:
        task = field("scheduler_jobs", row, "task_name")
        tenant = field("scheduler_jobs", row, "tenant")
        expected = (
            task_shard[task]
            if task in task_shard
            else _shards.shard_of(
                _shards.routing_key(tenant, task or field("scheduler_jobs", row, "handler")),
                count,
            )
        )
        assert where(schema) == expected, row
        job_shard[row[0]] = where(schema)
    for schema, row in snap["scheduler_runs"]:
        assert where(schema) == job_shard[field("scheduler_runs", row, "job_id")]
    for schema, row in snap["scheduler_decisions"]:
        assert where(schema) == task_shard[field("scheduler_decisions", row, "task_name")]
    for schema, row in snap["scheduler_audit"]:
        target = field("scheduler_audit", row, "target") or ""
        if target in task_shard:
            expected = task_shard[target]
        elif target.startswith("job ") and int(target[4:]) in job_shard:
            expected = job_shard[int(target[4:])]
        else:
            expected = 0
        assert where(schema) == expected, row
    for schema, row in snap["scheduler_limit_holds"]:
        expected = job_shard.get(field("scheduler_limit_holds", row, "job_id"), 0)
        assert where(schema) == expected, row
    # The shared tables: every shard has each row once (by key).
    for name, key in SHARED.items():
        per_shard: dict[str, Counter[Any]] = {}
        for schema, row in snap.get(name, []):
            per_shard.setdefault(schema, Counter())[field(name, row, key)] += 1
        keys = {k for c in per_shard.values() for k in c}
        assert len(per_shard) == count, name
        for counted in per_shard.values():
            assert set(counted) == keys and set(counted.values()) == {1}, name


def refused(url: str, shards: int) -> str:
    with pytest.raises(SchemaOutdated) as caught:
        make(url, shards).check_schema()
    return str(caught.value)


def check_after(app: Scheduler, url: str, before: int, snap: Any) -> None:
    """The new layout works: reads by id and name, check_schema with the new count and not
    the old; new ids fresh."""
    after = len(app.shards)
    fresh = make(url, after)
    fresh.check_schema()
    assert "--reshard" in refused(url, before)
    jobs = [row for _, row in snap["scheduler_jobs"]]
    for row in jobs:
        job = fresh.get_job(row[0])
        assert job is not None and job.id == row[0]
    ran = [row for _, row in snap["scheduler_runs"]]
    assert ran
    for row in ran[:10]:
        assert fresh.history(row[1])
    for _, row in snap["scheduler_rows"][:10]:
        explained = fresh.explain(row[1])
        assert explained["decisions"], row[1]
    highest = max(row[0] for name in ("scheduler_jobs", "scheduler_runs") for _, row in snap[name])
    new = [fresh.enqueue("t.later", tenant=t) for t in TENANTS for _ in range(3)]
    assert len(set(new)) == len(new) and min(new) > highest
    for job_id in new:
        found = fresh.get_job(job_id)
        assert found is not None and found.handler == "t.later"


def check_partitions(app: Scheduler) -> None:
    """The history and the decision log are still partitioned by day in every shard, and the
    moved rows (all of today) sit in today's partition: inserted through the parent."""
    today = f"_p{app.clock():%Y%m%d}"
    for shard in app.shards:
        with shard.store.read() as conn:
            for name in ("scheduler_runs", "scheduler_decisions"):
                kind = conn.execute(
                    text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": name}
                ).scalar()
                assert kind == "p", name
                held = set(
                    conn.execute(
                        text(f"SELECT DISTINCT tableoid::regclass::text FROM {name}")
                    ).scalars()
                )
                assert held <= {name + today}, held


def test_reshard_1_to_4_to_3_to_1_moves_every_row_once_to_its_shard(shards_url: str) -> None:
    clock = now_clock()
    one = make(shards_url, 1, clock)
    one.migrate()
    populate(one, 1)
    for before, after in ((1, 4), (4, 3), (3, 1)):
        snap = snapshot(make(shards_url, before))
        assert "--reshard" in (refused(shards_url, after) if after > 1 else "--reshard")
        app = make(shards_url, after, clock)
        result = app.reshard()
        assert not result.fitted and result.before == before and result.after == after
        moved = snapshot(app)
        assert routed_rows(moved) == routed_rows(snap)
        assert max(routed_rows(moved).values()) == 1
        assert sum(result.rows.values()) == sum(routed_rows(snap).values())
        assert sum(result.moved.values()) > 0
        check_placement(moved, after)
        assert sorted(schemas(app)) == sorted(
            [_shards.schema_name(i) for i in range(after)] if after > 1 else ["public"]
        )
        check_after(app, shards_url, before, moved)
        check_partitions(app)
        populate(app, after * 10)  # the new layout takes new rows, then moves them too
    final = snapshot(make(shards_url, 1))
    assert sum(1 for _ in final["scheduler_rows"]) == 16 * 4


def test_a_failure_halfway_leaves_every_row_once_and_a_rerun_finishes(shards_url: str) -> None:
    """Shard 3 of 4 cannot hand its rows on (a trigger in the target refuses them): shards 0
    to 2 moved (committed), shard 3 rolled back; every row once; both counts refused until
    the rerun finishes."""
    clock = now_clock()
    four = make(shards_url, 4, clock)
    four.migrate()
    populate(four, 1)
    snap = snapshot(four)
    # A task of shard 3: its insert into its shard of 3 fails.
    tenant = [c.name for c in metadata.tables["scheduler_rows"].columns].index("tenant")
    stuck = next(row for schema, row in snap["scheduler_rows"] if schema == "scheduler_shard_3")
    target = _shards.shard_of(_shards.routing_key(stuck[tenant], stuck[1]), 3)
    with four.store.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN IF NEW.id = {stuck[0]} THEN RAISE EXCEPTION 'disk full'; END IF;"
                " RETURN NEW; END $$"
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER refuse BEFORE INSERT ON scheduler_shard_{target}.scheduler_rows"
                " FOR EACH ROW EXECUTE FUNCTION public.refuse()"
            )
        )
    three = make(shards_url, 3, clock)
    with pytest.raises(Exception, match="disk full"):
        three.reshard()
    halfway = snapshot(four)
    assert routed_rows(halfway) == routed_rows(snap)  # none lost, none doubled
    assert {s for name in halfway for s, _ in halfway[name]} == {
        _shards.schema_name(i) for i in range(4)
    }
    assert "did not finish" in refused(shards_url, 3)
    assert "did not finish" in refused(shards_url, 4)
    with four.store.begin() as conn:
        conn.execute(text(f"DROP TRIGGER refuse ON scheduler_shard_{target}.scheduler_rows"))
    result = make(shards_url, 3, clock).reshard()
    assert not result.fitted and result.dropped == ["scheduler_shard_3"]
    done = snapshot(three)
    assert routed_rows(done) == routed_rows(snap)
    check_placement(done, 3)
    check_after(make(shards_url, 3, clock), shards_url, 4, done)
    with three.store.read() as conn:
        assert conn.execute(text("SELECT to_regclass(:m)"), {"m": MARKER}).scalar() is None


def test_a_layout_that_fits_is_left_alone(shards_url: str) -> None:
    app = make(shards_url, 1)
    app.migrate()
    _left_alone(app)


def test_a_layout_of_4_shards_that_fits_is_left_alone(sharded_url: str) -> None:
    _left_alone(make(sharded_url, 4))


def _left_alone(app: Scheduler) -> None:
    app.enqueue("t.ok", tenant="acme")
    snap = snapshot(app)
    result = app.reshard()
    assert result.fitted and "nothing to move" in result.summary()
    assert snapshot(app) == snap


def test_live_workers_and_claimed_jobs_are_refused_nothing_written(shards_url: str) -> None:
    clock = now_clock()
    one = make(shards_url, 1, clock)
    one.migrate()
    populate(one, 1)
    _health.touch(one.store, "host:42:abcd", clock() - timedelta(seconds=5), None)
    snap = snapshot(one)
    with pytest.raises(SchedulerError) as caught:
        make(shards_url, 4, clock).reshard()
    assert "migrate --reshard" in str(caught.value) and "host:42:abcd" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert snapshot(one) == snap and schemas(one) == ["public"]
    # Seen 31 s ago: stopped (kill -9); a host's tick record is no worker.
    _health.touch(one.store, "host:42:abcd", clock() - timedelta(seconds=31), None)
    _health.record_tick(one.store, clock(), clock())
    job = one.enqueue("t.ok", tenant="acme")
    with one.store.begin() as conn:  # as a claim leaves it
        conn.execute(
            text("UPDATE scheduler_jobs SET state = 'claimed', lease_owner = 'w' WHERE id = :i"),
            {"i": job},
        )
    snap = snapshot(one)
    with pytest.raises(SchedulerError, match=r"1 job\(s\) are claimed or running"):
        make(shards_url, 4, clock).reshard()
    assert snapshot(one) == snap and schemas(one) == ["public"]
    with one.store.begin() as conn:
        conn.execute(text("UPDATE scheduler_jobs SET state = 'queued' WHERE id = :i"), {"i": job})
    assert not make(shards_url, 4, clock).reshard().fitted


def test_two_active_jobs_of_one_dedupe_key_bound_for_one_shard_are_refused(
    sharded_url: str,
) -> None:
    four = make(sharded_url, 4)
    tenants = {}  # two tenants in different shards of 4 and the same of 1
    for n in range(50):
        tenants.setdefault(_shards.shard_of(f"t{n}", 4), f"t{n}")
    first, second = list(tenants.values())[:2]
    a = four.enqueue("t.later", dedupe_key="k", tenant=first)
    b = four.enqueue("t.later", dedupe_key="k", tenant=second)
    assert a != b
    snap = snapshot(four)
    with pytest.raises(SchedulerError, match=f"jobs {a} and {b} both hold dedupe key 'k'"):
        make(sharded_url, 1).reshard()
    assert snapshot(four) == snap


def test_the_version_table_has_one_name() -> None:
    from scheduler._store.migrate import VERSION_TABLE

    assert _shards.VERSION_TABLE == VERSION_TABLE


def test_reshard_on_sqlite_is_refused(tmp_path: Path) -> None:
    app = Scheduler(f"sqlite:///{tmp_path / 'app.db'}", registry=registry())
    app.migrate()
    with pytest.raises(ConfigError, match="migrate --reshard: shards are schemas of one"):
        app.reshard()
