"""Every module of the package imports first, on its own: no import circle that only works in
one order. ``scheduler._dispatch`` imported before ``scheduler._tick`` went round in a circle
(``cannot import name 'Carried' from partially initialized module``) and broke a test file
that happened to be the first to import it."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import importlib, pkgutil, sys
import scheduler

names = sorted(
    m.name
    for m in pkgutil.walk_packages(scheduler.__path__, "scheduler.")
    if not m.name.endswith("__main__")  # runs the command
    # Django's own app loading imports these (a model needs configured settings); the admin
    # test (tests/e2e/test_django_admin.py) loads them as a Django project does.
    and m.name not in ("scheduler.contrib.django.models", "scheduler.contrib.django.admin")
)
for name in names:
    for loaded in [m for m in sys.modules if m == "scheduler" or m.startswith("scheduler.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an extra's library that is not installed
        if (exc.name or "").startswith("scheduler"):
            print("FAILED", name, exc)
    except ImportError as exc:
        print("FAILED", name, exc)
print("modules", len(names))
"""


def test_every_module_imports_first_on_its_own() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line for line in lines if line.startswith("FAILED")] == []
    assert int(lines[-1].split()[1]) > 60  # the walk found the package's modules
