"""``manage.py scheduler COMMAND [ARGS]``: every ``scheduler`` command, with ``SCHEDULER``.

The arguments go to the ``scheduler`` command line as they are (``manage.py scheduler status
--json``, ``manage.py scheduler worker``, ``manage.py scheduler --help``); the Scheduler they
act on is :func:`scheduler.contrib.django.get_scheduler`'s, so ``--config`` is not used.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError


def _without_django_options(args: list[str]) -> list[str]:
    """``--settings`` and ``--pythonpath`` are manage.py's (it has applied them already)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--settings", "--pythonpath"):
            skip = True
        elif not arg.startswith(("--settings=", "--pythonpath=")):
            kept.append(arg)
    return kept


def _run(args: list[str], prog_name: str) -> None:
    from scheduler.cli import main
    from scheduler.contrib.django import get_scheduler

    main(args, app_factory=get_scheduler, prog_name=prog_name)


class Command(BaseCommand):
    help = "Run a scheduler command (migrate, sync, worker, status, ...) with settings.SCHEDULER."

    def run_from_argv(self, argv: list[str]) -> None:
        prog = f"{os.path.basename(argv[0])} {argv[1]}"
        _run(_without_django_options(argv[2:]), prog)  # exits with the command's status

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "args", nargs=argparse.REMAINDER, help="a scheduler command, its arguments"
        )

    def handle(self, *args: str, **options: Any) -> None:
        """``call_command("scheduler", "status", "--json")``: SystemExit 0 returns."""
        try:
            _run(list(args), "manage.py scheduler")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise CommandError(f"scheduler {' '.join(args)}: exit status {exc.code}") from None
