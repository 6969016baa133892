"""The dashboard with ``[database] shards = 4`` (Starlette's TestClient, a real PostgreSQL):
every page shows every shard's tasks and jobs, merged as one database's would be; the job and
task pages read their shard; the actions and the bulk actions change the job in its shard."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.shard_reads import SHARDS, Seeded, seed, sharded_app
from starlette.testclient import TestClient

from scheduler import Scheduler
from scheduler.dashboard import hash_password
from scheduler.dashboard._counts import FinishedCounts

PASSWORD = "correct horse"
HASH = hash_password(PASSWORD, ln=10)  # cheap for tests

# On PostgreSQL directly only: the pages and actions merge what the app reads from each
# shard, and each shard's reads and writes through PgBouncer (its search_path set in each
# transaction) are proved by tests/store/test_shards.py, test_shards_status.py and
# test_sharded_worker.py's pooled cases; through the pooler these were the same cases again.
pytestmark = pytest.mark.direct


@pytest.fixture
def seeded(sharded_url: str) -> Iterator[Seeded]:
    app = sharded_app(sharded_url)
    yield seed(app)
    app.close()


def client(app: Scheduler, **settings: Any) -> TestClient:
    from helpers.dashboard_client import client as made

    return made(app, **settings)


def csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


def signed_in(app: Scheduler) -> tuple[TestClient, str]:
    c = client(app, actions=True, username="ops", password_hash=HASH)
    token = csrf(c.get("/login").text)
    r = c.post("/login", data={"username": "ops", "password": PASSWORD, "csrf": token})
    assert r.status_code == 303, r.text
    return c, csrf(c.get("/tasks").text)


def listed(page: str, attribute: str) -> list[str]:
    return [html.unescape(v) for v in re.findall(rf'<tr data-{attribute}="([^"]+)"', page)]


def next_link(page: str) -> str | None:
    found = re.search(r'<a href="([^"]+)">(?:next|older) →</a>', page)
    return html.unescape(found.group(1)) if found else None


def test_the_tasks_pages_list_every_shards_tasks_by_name_with_their_runs(
    seeded: Seeded,
) -> None:
    c = client(seeded.app)
    first = c.get("/tasks")
    assert first.status_code == 200
    assert listed(first.text, "task") == seeded.names[:50]
    link = next_link(first.text)
    assert link == f"/tasks?after={seeded.names[49]}"
    second = c.get(link).text
    assert listed(second, "task") == seeded.names[50:]
    assert next_link(second) is None
    tenant = c.get("/tasks?tenant=tenant-5").text
    assert listed(tenant, "task") == [n for n in seeded.names if int(n[-2:]) % 12 == 5]
    disabled = c.get("/tasks?state=disabled").text
    assert listed(disabled, "task") == sorted(seeded.disabled.values())

    for index, names in seeded.tasks.items():  # each shard's run task: its strip, its page
        ran = seeded.app.jobs(task=names[0])
        assert len(ran) == 1
        cell = f'href="/jobs/{ran[0].id}" title="succeeded'
        assert cell in (first.text + second), (index, names[0])
        page = c.get(f"/tasks/{names[0]}")
        assert page.status_code == 200 and names[0] in page.text
        assert f"/jobs/{ran[0].id}" in page.text  # its last runs, read in its shard
    assert c.get("/tasks/no-such-task").status_code == 404


def test_the_jobs_pages_list_every_shards_jobs_newest_first(seeded: Seeded) -> None:
    c = client(seeded.app)
    newest = sorted(seeded.job_ids, reverse=True)
    first = c.get("/jobs").text
    assert listed(first, "job") == [str(i) for i in newest[:50]]
    link = next_link(first)
    assert link == f"/jobs?before={newest[49]}"
    assert listed(c.get(link).text, "job") == [str(i) for i in newest[50:]]
    aborted = sorted((i for ids in seeded.aborted.values() for i in ids), reverse=True)
    assert listed(c.get("/jobs?state=aborted").text, "job") == [str(i) for i in aborted]
    for index in range(SHARDS):
        job_id = seeded.aborted[index][0]
        page = c.get(f"/jobs/{job_id}")
        assert page.status_code == 200, index
        assert "bad_input" in page.text  # its attempt, read in its shard
    assert c.get(f"/jobs/{max(newest) + 100}").status_code == 404


def test_health_running_queues_and_audit_add_up_every_shard(seeded: Seeded) -> None:
    app = seeded.app
    c = client(app)
    health = c.get("/health").text
    assert f"<b>{15 * SHARDS}</b><span>queued</span>" in health
    assert f"<b>{15 * SHARDS}</b><span>waiting (ready)</span>" in health
    finished = FinishedCounts(app, 0.0)
    finished.get()
    finished.wait(30)
    assert finished.get().counts == {"succeeded": SHARDS, "aborted": SHARDS}

    queues = c.get("/queues").text
    assert f'<a href="/jobs?state=queued&amp;queue=default">{15 * SHARDS}</a>' in queues
    assert c.get("/running").status_code == 200

    audit = c.get("/audit").text
    for index, name in seeded.disabled.items():
        assert f"seed shard {index}" in audit
        one = c.get(f"/audit?target={name}").text
        assert f"seed shard {index}" in one
        others = {f"seed shard {k}" for k in range(SHARDS) if k != index}
        assert not any(reason in one for reason in others)


def test_retry_cancel_and_bulk_retry_change_each_job_in_its_shard(seeded: Seeded) -> None:
    app = seeded.app
    c, token = signed_in(app)
    retried = seeded.aborted[1][0]
    r = c.post(f"/actions/retry/{retried}", data={"csrf": token, "reason": "fixed"})
    assert r.status_code == 303, r.text
    assert app.get_job(retried).state == "queued"  # type: ignore[union-attr]
    cancelled = seeded.queued[3][0]
    r = c.post(f"/actions/cancel/{cancelled}", data={"csrf": token, "reason": "not needed"})
    assert r.status_code == 303, r.text
    assert app.get_job(cancelled).state == "aborted"  # type: ignore[union-attr]

    left = [*sorted(i for k, ids in seeded.aborted.items() if k != 1 for i in ids), cancelled]
    page = c.get("/jobs/bulk/retry?state=aborted").text
    assert f'<p class="bulk-count"><b>{len(left)}</b> job(s) will be queued again' in page
    form = page.split('class="act bulk">', 1)[1].split("</form>", 1)[0]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form))
    r = c.post("/actions/bulk/retry", data={**fields, "reason": "all of them"})
    assert r.status_code == 303, r.text
    assert [app.get_job(i).state for i in left] == ["queued"] * len(left)  # type: ignore[union-attr]
    entries = [e for e in app.audit(limit=1000) if e.reason == "all of them"]
    assert sorted(e.detail or "" for e in entries) == sorted(f"job {i}" for i in left)
    assert {e.actor for e in entries} == {"ops"}
