"""What ``status``, the dashboard, the metrics and ``explain`` read: the health of the queue and
the rows, and the warnings about them. Read-only, each a few bounded statements."""
