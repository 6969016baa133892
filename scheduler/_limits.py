"""Defaults and names the command line shows in its help, kept apart from the modules that use
them so that ``scheduler --help`` imports neither SQLAlchemy nor Alembic nor croniter."""

from __future__ import annotations

#: The jobs' states, in their order (``scheduler._store.tables.JobState``'s values).
JOB_STATES = ("queued", "claimed", "succeeded", "aborted")
#: Jobs ``scheduler jobs`` and ``app.jobs()`` list unless told otherwise.
LIST_LIMIT = 50
#: Entries ``scheduler audit`` and ``app.audit()`` list unless told otherwise.
AUDIT_LIMIT = 50
#: The most slots one backfill takes unless told otherwise (``--max``).
BACKFILL_MAX = 1000
