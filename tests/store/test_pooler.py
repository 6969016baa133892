"""Many workers behind PgBouncer in transaction mode: the short run of
``reliability/pooler_load.py`` (its long run: 10 processes x 8 job threads over 8 server
connections for 5 minutes, figures in docs/guarantees.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import pgbouncer_url

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "reliability"))

import pooler_load  # noqa: E402


@pytest.mark.slow
def test_workers_behind_pgbouncer_mixed_load(direct_pg_url: str, tmp_path: Path) -> None:
    pgbouncer_url()  # skips (fails under CI) without pgbouncer
    figures, notes = pooler_load.run(
        direct_pg_url,
        seconds=8,
        workers_count=3,
        concurrency=4,
        pool=4,
        tasks=10,
        rate=10,
        seed=25,
        prepare=False,
        out=tmp_path,
    )
    failed = {f.name: f.value for f in figures if f.failed}
    assert failed == {}, (failed, notes)
    values = {f.name: f.value for f in figures}
    assert values["slots dispatched"] >= 40 and values["jobs acknowledged (enqueued)"] >= 40
