"""The pages of the present: Running (every job running now, its worker and its lease) and
Queues (each queue's ready, scheduled, running and failed jobs, its throughput, and a chart of
the attempts that succeeded and failed over the last day)."""

from __future__ import annotations

from datetime import timedelta

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._store.status import present as _present
from .._store.status import shards as _shards
from ._chart import chart
from ._state import Dashboard, page

CHART_WINDOW = timedelta(hours=24)
CHART_BUCKETS = 24


def running(dash: Dashboard, request: Request) -> Response:
    now = dash.app.clock()
    every = []
    for shard in dash.app.shards:  # [database] shards: every shard's, merged
        with shard.store.read() as conn:
            every.append(_present.running(conn))
    found = every[0] if len(every) == 1 else _shards.running(every, _present.RUNNING_LIMIT)
    lease = timedelta(seconds=dash.app.worker_settings.lease_seconds)
    for job in found:
        # A heartbeat (or the claim) sets the lease to end a lease length later: this app's
        # [worker] lease_seconds, which the workers share when they share the file.
        job["heartbeat_at"] = job["lease_expires_at"] - lease
        job["expired"] = job["lease_expires_at"] <= now
    return dash.render(
        request,
        "running.html",
        {
            "running": found,
            "limit": _present.RUNNING_LIMIT,
            "lease_seconds": lease.total_seconds(),
        },
    )


def queues(dash: Dashboard, request: Request) -> Response:
    now = dash.app.clock()
    # Whole hours: the last bar is the hour under way, so a bar's bounds stay put between
    # refreshes and only the last one grows.
    end = now.replace(minute=0, second=0, microsecond=0) + CHART_WINDOW / CHART_BUCKETS
    every_lines, every_bars = [], []
    for shard in dash.app.shards:  # [database] shards: every shard's, added up
        with shard.store.read() as conn:
            every_lines.append(_present.queues(conn, now))
            every_bars.append(
                _present.run_history(conn, end, window=CHART_WINDOW, buckets=CHART_BUCKETS)
            )
    lines, buckets = every_lines[0], every_bars[0]
    if len(every_lines) > 1:
        lines, buckets = _shards.queue_lines(every_lines), _shards.buckets(every_bars)
    return dash.render(
        request,
        "queues.html",
        {
            "queues": lines,
            "buckets": buckets,
            "chart": chart(buckets, title="Attempts that succeeded and failed, last 24 hours"),
        },
    )


def routes(dash: Dashboard) -> list[Route]:
    return [Route("/running", page(dash, running)), Route("/queues", page(dash, queues))]
