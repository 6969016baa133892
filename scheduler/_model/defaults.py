"""The defaults the command line shows in its help, in a module that imports nothing: so that
``scheduler --help`` reads them without SQLAlchemy, Alembic, croniter, or even the rules'
modules (``rules.py`` re-exports them)."""

#: The jobs' states, in their order (``rules.JobState``'s values).
JOB_STATES = ("queued", "claimed", "succeeded", "aborted")
#: Jobs ``scheduler jobs`` and ``app.jobs()`` list unless told otherwise.
LIST_LIMIT = 50
#: Entries ``scheduler audit`` and ``app.audit()`` list unless told otherwise.
AUDIT_LIMIT = 50
#: The most slots one backfill takes unless told otherwise (``--max``).
BACKFILL_MAX = 1000
