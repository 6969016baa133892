"""The scheduler's tasks in Django's admin (``scheduler.contrib.django``): the test project
(``tests/helpers/djangoproject``, with ``settings_admin``: the admin installed) migrated by its own
``manage.py``, then Django's test client, as a superuser, against the real admin pages, in
that project's process (``manage.py shell``); what the pages did is checked here through the
scheduler's own reads.

The list shows every task, searchable by name and filtered by source, group and tenant; the
application's tasks are added, changed, paused, resumed and deleted through ``put_task``,
``disable``, ``enable`` and ``remove_task`` (audited as the admin user); a task of the file is
read-only; a refused form shows the error beside its field and writes nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import _SESSION, MYSQL_SERVER, PG_SERVER, require_server
from sqlalchemy import create_engine, text

from scheduler import Scheduler, TaskSpec
from scheduler._model.handlers import Registry

pytest.importorskip("django")

pytestmark = pytest.mark.slow  # manage.py in subprocesses, Django's migrations

PROJECT = Path(__file__).resolve().parents[1] / "helpers" / "djangoproject"

# Run inside the project: Django's test client against the admin; prints what it saw.
SCENARIO = r"""
import json, re
from django.contrib.auth.models import User
from django.test import Client
from django.test.utils import setup_test_environment
from scheduler.contrib.django.models import Task

setup_test_environment()  # the client keeps each response's template context
User.objects.create_superuser("ann", "ann@example.com", "pw")
c = Client()
assert c.login(username="ann", password="pw")
seen = {}

def names(url):
    page = c.get(url)
    assert page.status_code == 200, (url, page.status_code)
    return sorted(set(re.findall(r'/admin/scheduler/task/\d+/change/[^"]*">([^<]+)<', page.text)))

base = "/admin/scheduler/task/"
seen["all"] = names(base)
seen["search"] = names(base + "?q=crm")
seen["file"] = names(base + "?source__exact=file")
seen["group"] = names(base + "?group=customer-42")
seen["tenant"] = names(base + "?tenant=globex")
form = {"name": "report-7", "cron": "30 7 * * 1", "timezone": "Europe/Berlin",
        "handler": "reports.weekly", "payload": '{"customer": 7}', "tenant": "acme",
        "group": "customer-7", "overlap": "hold", "catchup_window": "0", "jitter": "0",
        "max_consecutive_failures": "", "enabled": "on"}
bad = c.post(base + "add/", {**form, "timezone": "Mars/Olympus"})
seen["bad_status"] = bad.status_code
seen["bad_errors"] = {
    field: [m for m in errors]
    for field, errors in bad.context["adminform"].form.errors.items()
}
added = c.post(base + "add/", form)
seen["add_status"] = added.status_code
seen["file_name"] = c.post(base + "add/", {**form, "name": "tidy"}).context["adminform"].form.errors
crm = Task.objects.get(name="crm-sync-42")
change_page = c.get(f"{base}{crm.pk}/change/")
seen["change_has_save"] = 'name="_save"' in change_page.text
changed = c.post(f"{base}{crm.pk}/change/", {**form, "cron": "0 7 * * 1-5", "name": "ignored"})
seen["change_status"] = changed.status_code
tidy = Task.objects.get(name="tidy")
file_page = c.get(f"{base}{tidy.pk}/change/")
seen["file_page"] = file_page.status_code
seen["file_has_save"] = 'name="_save"' in file_page.text
seen["file_messages"] = [str(m) for m in file_page.context["messages"]]
seen["file_post"] = c.post(f"{base}{tidy.pk}/change/", {**form, "cron": "0 9 * * *"}).status_code
seen["file_delete"] = c.post(f"{base}{tidy.pk}/delete/", {"post": "yes"}).status_code
paused = c.post(base, {"action": "pause_tasks", "_selected_action": [crm.pk, tidy.pk]}, follow=True)
seen["pause_messages"] = [str(m) for m in paused.context["messages"]]
seen["after_pause"] = Task.objects.get(name="crm-sync-42").enabled
c.post(base, {"action": "resume_tasks", "_selected_action": [crm.pk]})
seen["after_resume"] = Task.objects.get(name="crm-sync-42").enabled
other = Task.objects.get(name="crm-sync-43")
seen["delete_status"] = c.post(f"{base}{other.pk}/delete/", {"post": "yes"}).status_code
try:
    Task.objects.get(name="tidy").save()
except TypeError as exc:
    seen["save_refused"] = str(exc)
bulk = {
    "update": lambda: Task.objects.filter(name="tidy").update(cron="* * * * *"),
    "delete": lambda: Task.objects.filter(name="crm-sync-42").delete(),
    "bulk_create": lambda: Task.objects.bulk_create([Task(name="x", handler="h")]),
    "bulk_update": lambda: Task.objects.bulk_update([tidy], ["cron"]),
    "create": lambda: Task.objects.create(name="y", cron="* * * * *", handler="h"),
    "update_or_create": lambda: Task.objects.update_or_create(name="tidy", defaults={"jitter": 9}),
}
seen["bulk_refused"] = {}
for what, call in bulk.items():
    try:
        call()
    except TypeError as exc:
        seen["bulk_refused"][what] = str(exc)
print("SEEN " + json.dumps(seen))
"""


def manage(url: str, *args: str) -> str:
    env = {**os.environ, "SCHEDULER_TEST_DJANGO_URL": url}
    for name in ("SCHEDULER_CONFIG", "SCHEDULER_DATABASE_URL", "DJANGO_SETTINGS_MODULE"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "manage.py", *args, "--settings", "djangoproject.settings_admin"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def run(url: str, *statements: str) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def admin_url(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path
) -> Iterator[str]:
    """A database of its own (a SQLite file, a PostgreSQL schema, a MariaDB database) with the
    scheduler's tables and the project's, Django's admin's included; dropped afterwards, so the
    admin's tables never meet the other Django tests' in the session's schema."""
    backend = request.param
    if backend == "sqlite":
        path = tmp_path / "admin.db"
        shutil.copy(sqlite_template, path)  # the scheduler's tables, migrated
        url = f"sqlite:///{path}"
        drop: tuple[str, str] | None = None
    elif backend == "postgresql":
        name = f"{_SESSION}_admin"
        require_server(PG_SERVER, "PostgreSQL")
        run(PG_SERVER, f"DROP SCHEMA IF EXISTS {name} CASCADE", f"CREATE SCHEMA {name}")
        url = f"{PG_SERVER}?options=-csearch_path%3D{name}"
        drop = (PG_SERVER, f"DROP SCHEMA IF EXISTS {name} CASCADE")
    else:
        name = f"{_SESSION}_admin"
        require_server(MYSQL_SERVER, "MariaDB")
        run(MYSQL_SERVER, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}")
        url = MYSQL_SERVER.rsplit("/", 1)[0] + f"/{name}"
        drop = (MYSQL_SERVER, f"DROP DATABASE IF EXISTS {name}")
    try:
        if drop is not None:
            migrating = Scheduler(url, registry=Registry())
            migrating.migrate()
            migrating.close()
        manage(url, "migrate", "--verbosity", "0")  # Django's own (admin, auth, sessions)
        yield url
    finally:
        if drop is not None:
            run(*drop)


def test_the_admin_lists_filters_and_changes_tasks_through_the_scheduler(admin_url: str) -> None:
    url = admin_url
    app = Scheduler(url, registry=Registry())
    try:
        app.sync([TaskSpec("tidy", "0 4 * * *", "shop.tidy", {}, "UTC")])
        for name, tenant, group in (
            ("crm-sync-42", "acme", "customer-42"),
            ("crm-sync-43", "globex", "customer-43"),
        ):
            app.put_task(
                TaskSpec(
                    name,
                    "0 6 * * 1-5",
                    "crm.sync",
                    {},
                    "UTC",
                    tenant=tenant,
                    group=group,
                    timeout=30,  # no field on the admin's form: kept by a change there
                    recovery="probe",
                    probe_intervals=(60, 600),
                )
            )
        out = manage(url, "shell", "-c", SCENARIO)
        seen: dict[str, Any] = json.loads(out.split("SEEN ", 1)[1])

        assert seen["all"] == ["crm-sync-42", "crm-sync-43", "tidy"]
        assert seen["search"] == ["crm-sync-42", "crm-sync-43"]
        assert seen["file"] == ["tidy"]
        assert seen["group"] == ["crm-sync-42"]
        assert seen["tenant"] == ["crm-sync-43"]

        # a refused form: the error beside its field, nothing written
        assert seen["bad_status"] == 200
        [message] = seen["bad_errors"]["timezone"]
        assert message.startswith("task 'report-7': key 'timezone': unknown timezone")
        assert "managed by" in seen["file_name"]["name"][0]
        # added through put_task, as the admin user
        assert seen["add_status"] == 302
        row = app.get_row("report-7")
        assert row is not None and (row.source, row.group, row.tenant) == (
            "api",
            "customer-7",
            "acme",
        )
        assert row.payload == {"customer": 7} and row.timezone == "Europe/Berlin"
        entry = app.audit("report-7")[0]
        assert (entry.action, entry.actor) == ("put_task", "ann")

        # changed: the name stays; the file's task is read-only
        assert seen["change_has_save"] and seen["change_status"] == 302
        crm = app.get_row("crm-sync-42")
        assert crm is not None and crm.cron == "0 7 * * 1-5" and app.get_row("ignored") is None
        assert (crm.timeout, crm.recovery, crm.probe_intervals) == (30.0, "probe", (60.0, 600.0))
        assert seen["file_page"] == 200 and not seen["file_has_save"]
        assert seen["file_messages"][-1] == (
            "tidy is managed by settings.SCHEDULER: change it there and run"
            " `manage.py scheduler sync`."
        )
        assert seen["file_post"] == 403 and seen["file_delete"] == 403
        tidy = app.get_row("tidy")
        assert tidy is not None and tidy.cron == "0 4 * * *" and tidy.enabled

        # pause and resume: the application's tasks only
        assert seen["pause_messages"] == [
            "Paused: crm-sync-42",
            "Not paused, managed by settings.SCHEDULER: tidy",
        ]
        assert seen["after_pause"] is False and seen["after_resume"] is True
        assert [e.action for e in app.audit("crm-sync-42")][:2] == ["enable", "disable"]

        # deleted through remove_task
        assert seen["delete_status"] == 302 and app.get_row("crm-sync-43") is None
        assert app.audit("crm-sync-43")[0].action == "remove_task"
        assert "put_task" in seen["save_refused"]
        # a queryset's writes in bulk are refused as save() is, and changed nothing
        refused = seen["bulk_refused"]
        assert sorted(refused) == sorted(
            ["update", "delete", "bulk_create", "bulk_update", "create", "update_or_create"]
        )
        assert "remove_task" in refused["delete"] and "put_task" in refused["update"]
        tidy = app.get_row("tidy")
        assert tidy is not None and tidy.cron == "0 4 * * *"
        assert app.get_row("crm-sync-42") is not None
        assert app.get_row("x") is None and app.get_row("y") is None
    finally:
        app.close()
