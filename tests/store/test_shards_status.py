"""``status`` and its summary with ``[database] shards = 4``: every shard's rows, jobs and
health merged into what one database would have answered (the CLI's own tests:
tests/cli/test_shards_reads.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from helpers.shard_reads import SHARDS, Seeded, seed, sharded_app

from scheduler._store.status import health as _health
from scheduler.testing import ManualClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def seeded(sharded_url: str, clock: ManualClock) -> Iterator[Seeded]:
    app = sharded_app(sharded_url, clock=clock)
    yield seed(app)
    app.close()


def test_the_summary_counts_and_names_every_shards_rows(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = seeded.app
    assert app.status_summary() is None  # 60 rows: at most 200, the full list
    monkeypatch.setattr(_health, "SUMMARY_ABOVE", 10)
    summary = app.status_summary(limit=3)
    assert summary is not None
    assert summary["rows_total"] == len(seeded.names)
    assert summary["rows_enabled"] == len(seeded.names) - SHARDS
    assert summary["rows_counted"]["disabled"] == SHARDS
    disabled = sorted(seeded.disabled.values())
    assert [a["name"] for a in summary["attention"]] == disabled[:3]  # the first by name
    assert summary["attention_more"] is True
    assert summary["jobs"] == {"queued": 15 * SHARDS, "claimed": 0, "succeeded": 4, "aborted": 4}
    assert [s["shard"] for s in summary["health"]["shards"]] == list(range(SHARDS))


def test_the_rows_are_walked_page_by_page_in_every_shard_merged_by_name(
    seeded: Seeded,
) -> None:
    stores = [shard.store for shard in seeded.app.shards]
    assert [row["name"] for row in _health.status_rows(stores, page=7)] == seeded.names
    assert [row["name"] for row in seeded.app.status_rows()] == seeded.names
    one = _health.status_rows(stores[2], page=7)  # one store: that shard's alone
    assert [row["name"] for row in one] == sorted(seeded.tasks[2])


def test_no_tick_names_the_shards_behind_and_the_last_tick_is_every_shards(
    seeded: Seeded, clock: ManualClock
) -> None:
    app = seeded.app
    first = app.status()["health"]
    assert first["last_tick_at"] == START.isoformat().replace("+00:00", "Z")
    assert not any("no scheduler tick" in w for w in first["warnings"])

    clock.advance(minutes=10)
    for shard in app.shards[:2]:  # a worker that serves shards 0-1 only
        shard.tick()
    health = app.status()["health"]
    assert health["last_tick_at"] == first["last_tick_at"]  # shards 2 and 3 had none since
    ticks = [s["last_tick_at"] for s in health["shards"]]
    assert ticks[0] == ticks[1] != ticks[2] == ticks[3] == first["last_tick_at"]
    assert [w for w in health["warnings"] if "no scheduler tick" in w] == [
        f"no scheduler tick since {first['last_tick_at']} in shard(s) 2, 3 and no worker is"
        " running: start `scheduler worker`"
    ]


def test_a_worker_of_every_shard_is_one_worker_and_a_paused_queue_one_queue(
    seeded: Seeded, clock: ManualClock
) -> None:
    app = seeded.app
    now = clock()
    for index, shard in enumerate(app.shards):  # what a worker serving every shard writes
        _health.touch(shard.store, "host:1:abc", now - timedelta(seconds=index), now, stuck=1)
    app.pause_queue("default", reason="maintenance")
    health = app.status()["health"]
    assert [w["id"] for w in health["workers"]] == ["host:1:abc"]
    assert health["workers"][0]["last_seen_at"] == now.isoformat().replace("+00:00", "Z")
    assert f"{SHARDS} attempt(s) still running past their stop on worker host:1:abc" in (
        " ".join(health["warnings"])
    )
    assert [p["queue"] for p in health["paused_queues"]] == ["default"]
    assert health["waiting"] == 15 * SHARDS
