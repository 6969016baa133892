"""The model: what the scheduler decides, as pure functions and plain types.

Nothing here reads a clock, touches a database or imports SQLAlchemy: time is a parameter
(``now``), rows and jobs are plain values. The modules are imported one by one (``cron``
brings croniter), never through this package.
"""
