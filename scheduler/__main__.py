"""``python -m scheduler``: the same as the ``scheduler`` command."""

from scheduler.cli import console

console()
