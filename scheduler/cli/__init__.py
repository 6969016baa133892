"""The ``scheduler`` command: migrate, sync, tick, worker, status, enable, disable, trigger, and
the operators' commands.

Users read "task" everywhere (help, messages, logs); "row" is the table's word, kept for the
names that are contract: the ``row_disabled`` signal and the ``rows`` key of ``status --json``.

The configuration file comes from ``--config``, else ``SCHEDULER_CONFIG``, else ``app.toml`` in
the current directory. Every error is one line on stderr (``error: ...``) and exit status 1
(2 for a usage error); ``--debug`` adds the traceback. Logging is configured here and only here.

``_group.py`` holds the group and the entry points; the commands are in ``tasks.py``,
``jobs.py`` and ``serve.py``; ``output.py`` prints.
"""

from __future__ import annotations

from . import jobs, runtime, serve, tasks  # noqa: F401 - each registers its commands
from ._group import cli, console, describe, main

__all__ = ["cli", "console", "describe", "main"]
