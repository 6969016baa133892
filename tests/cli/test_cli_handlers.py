"""A task whose handler nobody registered: ``sync`` warns (once for many tasks), the worker
refuses to start, and ``sync`` says when it cannot check the handlers at all.
"""

from __future__ import annotations

from pathlib import Path

from helpers.cli_project import migrated as migrated  # the fixture
from helpers.cli_project import project, run

UNKNOWN = (
    '[[tasks]]\nname = "t1"\ncron = "0 3 * * *"\nhandler = "t.okk"\n\n'
    '[[tasks]]\nname = "t2"\ncron = "0 3 * * *"\nhandler = "t.ok"\n\n'
    '[[tasks]]\nname = "t3"\ncron = "0 3 * * *"\nhandler = "nobody"\n'
)


def test_sync_warns_and_the_worker_refuses_an_unknown_handler(
    tmp_path: Path, migrated: str
) -> None:
    project(tmp_path, migrated, tasks=UNKNOWN)
    synced = run(tmp_path, "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stdout.splitlines()[0] == "insert:    t1, t2, t3"
    imports = "not registered by [worker] imports (first_jobs)"
    assert synced.stderr.splitlines() == [
        f"warning: task 't1': handler 't.okk' is {imports}; did you mean 't.ok'?",
        f"warning: task 't3': handler 'nobody' is {imports}",
    ]
    refused, allowed = (
        run(tmp_path, "worker", "--once"),
        run(tmp_path, "worker", "--once", "--allow-unknown-handlers"),
    )
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.splitlines() == [
        f"error: task 't1': handler 't.okk' is {imports}; did you mean 't.ok'?",
        f"error: task 't3': handler 'nobody' is {imports}",
        "error: the worker does not start with unknown handlers: fix the tasks or"
        " [worker] imports, or pass --allow-unknown-handlers",
    ]
    assert allowed.returncode == 0, allowed.stderr
    assert f"WARNING scheduler.cli: task 't1': handler 't.okk' is {imports}" in allowed.stderr


def test_many_tasks_on_one_unknown_handler_are_one_line(tmp_path: Path, migrated: str) -> None:
    tasks = "".join(
        f'[[tasks]]\nname = "c{i}"\ncron = "0 3 * * *"\nhandler = "billing.invoice"\n\n'
        for i in range(5)
    )
    project(tmp_path, migrated, tasks=tasks)
    synced = run(tmp_path, "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stderr.splitlines() == [
        "warning: tasks 'c0', 'c1', 'c2' and 2 more (5): handler 'billing.invoice' is not"
        " registered by [worker] imports (first_jobs)"
    ]


def test_sync_says_when_it_cannot_check_the_handlers(tmp_path: Path, migrated: str) -> None:
    path = project(tmp_path, migrated, tasks=UNKNOWN)
    path.write_text(path.read_text().replace('"first_jobs"', '"first_jobs", "not_there"'))
    synced = run(tmp_path, "sync")
    assert synced.returncode == 0, synced.stderr
    assert synced.stderr.splitlines() == [
        "warning: handlers not checked: cannot import 'not_there' from [worker] imports:"
        " No module named 'not_there'"
    ]
