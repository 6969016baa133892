"""``python -m scheduler.cli``: the same as the ``scheduler`` command."""

from . import console

console()
