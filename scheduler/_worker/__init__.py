"""The worker: the long-running loop that ticks and runs jobs (``worker``), the running of one
attempt (``runner``) and the writing of outcomes in batches (``recorder``), the one event loop
for ``async def`` handlers (``events``), the worker inside a web process (``background``), what
it tells the outside world (``telemetry``), and what it needs of the application (``host``).
"""
