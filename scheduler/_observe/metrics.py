"""Prometheus metrics, from the official ``prometheus-client`` (``rerun-scheduler[metrics]``).

Their names and labels: docs/reference/metrics.md.

The worker serves them at ``/metrics`` on ``[metrics] port`` (0, the default, = off); a host
application or the dashboard mounts :func:`asgi_app`. Importing this module needs the extra;
nothing else in the package imports it unless metrics are on.

Two kinds of figures:

* **events**, counted where they happen in this process: job outcomes (told by the app's
  runners after each commit, so only what was committed), run time and queue wait (around
  the handler call in the worker), dispatch lateness, tick time and decisions (the
  worker's tick reports);
* **the database's state**, read by :class:`DatabaseCollector` at most once every
  ``[metrics] cache_seconds`` in **one** statement, whatever the scrape rate: jobs by state and
  queue, tasks enabled and disabled, each task's last success and consecutive failures, the
  workers alive; on PostgreSQL also the dead row versions of each scheduler table and the age
  of the oldest transaction holding the MVCC horizon (catalog reads in the same statement,
  ``scheduler/_store/status/metrics.py``).

Label values are bounded: handler, queue, task, worker ids, states and decisions; never a job
id or a payload.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import selectors
import socket
import socketserver
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    make_asgi_app,
    make_wsgi_app,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from .._config import MetricsSettings, WorkerSettings
from .._model.handlers import Registry
from .._model.job import Job, RecordedHook
from .._model.limits import LimitSet
from .._model.rules import STATES
from .._model.time import Clock
from .._store import Store
from .._store import limits as _limits
from .._store.status import horizon as _horizon
from .._store.status import metrics as _figures

if TYPE_CHECKING:
    from .._model.report import TickReport

log = logging.getLogger(__name__)


class MetricsHost(Protocol):
    """What the metrics need of the app (a :class:`~scheduler.MetricsHost`)."""

    store: Store
    registry: Registry
    clock: Clock
    worker_settings: WorkerSettings
    metrics_settings: MetricsSettings
    recorded_hooks: list[RecordedHook]
    """Told of every runner's committed outcomes (the job as written, and how it ended)."""

    def limit_set(self, *, check: bool = True) -> LimitSet:
        """The limits every worker shares (``[[limits]]``), with the handlers naming them."""
        ...


__all__ = [
    "DatabaseCollector",
    "Metrics",
    "MetricsServer",
    "RunTimes",
    "asgi_app",
    "metrics_for",
    "serve",
]

OUTCOMES = ("succeeded", "failed", "aborted", "abandoned")
DECISIONS = (
    "dispatched",
    "rerun",
    "held_back",
    "disabled",
    "lost_race",
    "skipped_overlap",
    "missed",
    "locked",
)
#: A worker not seen in scheduler_workers for this long counts as down (``worker_up`` 0).
WORKER_UP_SECONDS = 30.0
_ONE_SHOT_SUFFIX = ":tick"  # health.tick_record_id(): a tick's record, not a worker

# Jobs run from milliseconds to hours; ticks and lateness are short.
JOB_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _RunSeries:
    """One (handler, queue)'s run-time and queue-wait histograms: bucket counts and sums."""

    __slots__ = ("lock", "ran", "ran_sum", "waited", "waited_sum")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ran = [0] * (len(JOB_BUCKETS) + 1)  # the last: above every bound (+Inf only)
        self.ran_sum = 0.0
        self.waited = [0] * (len(WAIT_BUCKETS) + 1)
        self.waited_sum = 0.0

    def observe(self, seconds: float, wait: float) -> None:
        i, j = bisect.bisect_left(JOB_BUCKETS, seconds), bisect.bisect_left(WAIT_BUCKETS, wait)
        with self.lock:
            self.ran[i] += 1
            self.ran_sum += seconds
            self.waited[j] += 1
            self.waited_sum += wait


def le(bound: float) -> str:
    """A bucket's ``le`` label as ``prometheus_client`` writes it (``1.0``, ``0.005``, ``+Inf``)."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts as Prometheus' cumulative ``le`` buckets, ``+Inf`` last."""
    found, total = [], 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=True):
        total += count
        found.append((le(bound), float(total)))
    return found


class TickHistogram(Collector):
    """An unlabelled histogram the worker's tick feeds (tick time, dispatch lateness): one
    bisection and one lock per observation, where ``prometheus_client``'s takes two locks and
    a linear search (an idle tick's hook was mostly that)."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name, self.documentation, self.bounds = name, documentation, bounds
        self._lock = threading.Lock()
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self.name, self.documentation)
        family.add_metric([], _buckets(self.bounds, counts), total)
        yield family


class RunTimes(Collector):
    """``scheduler_job_duration_seconds`` and ``scheduler_job_queue_wait_seconds``, by handler
    and queue: one lock and two bisections per attempt for both (``prometheus_client``'s
    ``Histogram`` takes two locks per observation, four per attempt: a no-op job's metrics
    cost was mostly that)."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _RunSeries] = {}
        self._made = threading.Lock()

    def series(self, handler: str, queue: str) -> _RunSeries:
        key = (handler, queue)
        found = self._series.get(key)
        if found is None:
            with self._made:
                found = self._series.setdefault(key, _RunSeries())
        return found

    def collect(self) -> Iterable[Metric]:
        ran = HistogramMetricFamily(
            "scheduler_job_duration_seconds",
            "Time in the handler, per attempt.",
            labels=["handler", "queue"],
        )
        waited = HistogramMetricFamily(
            "scheduler_job_queue_wait_seconds",
            "From the moment a job was ready (its run_at) to its handler's start.",
            labels=["handler", "queue"],
        )
        for (handler, queue), series in list(self._series.items()):
            with series.lock:
                ran_counts, ran_sum = list(series.ran), series.ran_sum
                waited_counts, waited_sum = list(series.waited), series.waited_sum
            labels = [handler, queue]
            ran.add_metric(labels, _buckets(JOB_BUCKETS, ran_counts), ran_sum)
            waited.add_metric(labels, _buckets(WAIT_BUCKETS, waited_counts), waited_sum)
        yield ran
        yield waited


def _vacuum_metrics(dead: list[tuple[str | None, dict[str, int]]], age: float) -> Iterator[Metric]:
    tuples = GaugeMetricFamily(
        "scheduler_table_dead_tuples",
        "Dead row versions waiting for vacuum in each scheduler table (PostgreSQL,"
        " pg_stat_user_tables.n_dead_tup).",
        labels=_names(["table"], dead[0][0]),
    )
    for shard, found in dead:
        for table in _horizon.TABLES:
            tuples.add_metric(_labels([table], shard), float(found.get(table, 0)))
    yield tuples
    yield GaugeMetricFamily(
        "scheduler_oldest_transaction_age_seconds",
        "Age of the oldest transaction on this database that holds the MVCC horizon (PostgreSQL;"
        " a prepared transaction counts from its PREPARE); 0 when none does.",
        value=age,
    )


def _limit_metrics(found: list[tuple[str | None, dict[str, tuple[int, int]]]]) -> Iterator[Metric]:
    shard_label = found[0][0]
    in_use = GaugeMetricFamily(
        "scheduler_limit_in_use",
        "Attempts running under each limit, across every worker (all its partitions).",
        labels=_names(["limit"], shard_label),
    )
    waiting = GaugeMetricFamily(
        "scheduler_limit_waiting",
        "Ready jobs under each limit still queued (held back, or not claimed yet).",
        labels=_names(["limit"], shard_label),
    )
    for shard, figures in found:
        for name, (running, ready) in sorted(figures.items()):
            in_use.add_metric(_labels([name], shard), running)
            waiting.add_metric(_labels([name], shard), ready)
    yield from (in_use, waiting)


def _labels(values: list[str], shard: str | None) -> list[str]:
    """A series' label values, with its shard's last when sharded (``[database] shards``
    above 1; `shard` is then the shard's label value, else None)."""
    return values if shard is None else [*values, shard]


def _names(names: list[str], shard: str | None) -> list[str]:
    """A gauge's label names, with ``shard`` last when sharded (`shard` not None)."""
    return names if shard is None else [*names, "shard"]


def _shard_stores(app: MetricsHost) -> list[tuple[str | None, Store]]:
    """The stores to read, each with its ``shard`` label value: the app's alone (None), or,
    with ``[database] shards`` above 1, each shard's ("0", "1", ...)."""
    shards = getattr(app, "shards", None)  # a Scheduler's; a MetricsHost need not have them
    if not shards or len(shards) < 2:
        return [(None, app.store)]
    return [(str(index), shard.store) for index, shard in enumerate(shards)]


class DatabaseCollector(Collector):
    """The gauges read from the database, cached for ``cache_seconds`` (one statement each
    refresh; one per shard with ``[database] shards`` above 1, each gauge then labelled with
    its ``shard``). A failed read is logged and the last figures are served meanwhile."""

    def __init__(self, app: MetricsHost, cache_seconds: float = 5.0) -> None:
        self.app = app
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._rows: list[tuple[str | None, list[Any]]] = []
        self._now: datetime | None = None
        self._limits: list[tuple[str | None, dict[str, tuple[int, int]]]] = []

    def describe(self) -> Iterable[Metric]:
        return []  # not read at registration: the database may not be there yet

    def _refresh(self) -> tuple[list[tuple[str | None, list[Any]]], datetime | None]:
        with self._lock:
            if time.monotonic() - self._read_at >= self.cache_seconds:
                now = self.app.clock()
                try:
                    stores = _shard_stores(self.app)
                    self._rows = [(shard, _figures.read(store, now)) for shard, store in stores]
                    self._now = now
                    limits = self.app.limit_set(check=False)
                    if limits:  # statements of their own, only where limits are configured
                        found = []
                        for shard, store in stores:
                            with store.read() as conn:
                                found.append((shard, _limits.gauges(conn, limits, now)))
                        self._limits = found
                except Exception as exc:
                    log.warning(
                        "metrics: cannot read the database: %s",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc),
                        extra={"action": "metrics_read_failed"},
                    )
                self._read_at = time.monotonic()  # failed or not: no retry storm
            return self._rows, self._now

    def collect(self) -> Iterator[Metric]:
        every, read_at = self._refresh()
        labelled = every[0][0] if every else None  # a shard's label value: sharded

        def labels(*names: str) -> list[str]:
            return _names(list(names), labelled)

        by_state = GaugeMetricFamily(
            "scheduler_jobs_by_state",
            "Jobs in each state, per queue (read from the database, cached).",
            labels=labels("state", "queue"),
        )
        oldest = GaugeMetricFamily(
            "scheduler_job_oldest_ready_age_seconds",
            "How long the oldest ready (queued and due) job of each queue has waited.",
            labels=labels("queue"),
        )
        tasks = GaugeMetricFamily(
            "scheduler_tasks", "Tasks (rows) enabled and disabled.", labels=labels("state")
        )
        success = GaugeMetricFamily(
            "scheduler_task_last_success_timestamp_seconds",
            "When each task's last successful job finished (Unix time; while its jobs are kept).",
            labels=labels("task"),
        )
        failures = GaugeMetricFamily(
            "scheduler_task_consecutive_failures",
            "Each task's consecutive failures (its row's count).",
            labels=labels("task"),
        )
        up = GaugeMetricFamily(
            "scheduler_worker_up",
            f"1 for a worker seen in the last {WORKER_UP_SECONDS:g}s, 0 for one that stopped"
            " without unregistering (until it is forgotten).",
            labels=labels("worker"),
        )
        dead: list[tuple[str | None, dict[str, int]]] = []
        vacuum: float | None = None  # PostgreSQL: the oldest horizon holder's age
        for shard, found in every or [(None, [])]:
            counts: dict[tuple[str, str], float] = {}
            queues = set(self.app.worker_settings.queues)
            ready_since: dict[str, datetime] = {}
            task_states = {"enabled": 0, "disabled": 0}
            shard_dead: dict[str, int] = {}
            for kind, a, b, n, at in found:
                if kind == "jobs":
                    counts[a, b] = n
                    queues.add(b)
                    if at is not None:
                        ready_since[b] = min(at, ready_since.get(b, at))
                elif kind == "task":
                    task_states[b] += 1
                    failures.add_metric(_labels([a], shard), n)
                    if at is not None:
                        success.add_metric(_labels([a], shard), at.timestamp())
                elif kind == "dead":
                    shard_dead[a] = int(n)
                elif kind == "horizon":  # the server's: the same in every shard's read
                    vacuum = float(n or 0.0)
                elif kind == "worker" and not a.endswith(_ONE_SHOT_SUFFIX) and read_at is not None:
                    alive = at >= read_at - timedelta(seconds=WORKER_UP_SECONDS)
                    up.add_metric(_labels([a], shard), 1.0 if alive else 0.0)
            dead.append((shard, shard_dead))
            for queue in sorted(queues):
                for state in STATES:
                    by_state.add_metric(
                        _labels([state, queue], shard), counts.get((state, queue), 0.0)
                    )
                since = ready_since.get(queue)
                age = 0.0 if since is None else (self.app.clock() - since).total_seconds()
                oldest.add_metric(_labels([queue], shard), max(age, 0.0))
            for task_state, number in task_states.items():
                tasks.add_metric(_labels([task_state], shard), number)
        yield from (by_state, oldest, tasks, success, failures, up)
        if self._limits:
            yield from _limit_metrics(self._limits)
        if vacuum is not None:
            yield from _vacuum_metrics(dead, vacuum)


class Metrics:
    """One app's metrics: the event counters fed by the worker and its runners, and the
    database gauges; each on its own registry (with the process collectors)."""

    def __init__(self, app: MetricsHost, *, cache_seconds: float | None = None) -> None:
        self.app = app
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        r = self.registry
        self.jobs = Counter(
            "scheduler_jobs",
            "Job attempts ended, by outcome (failed: will retry; abandoned: not retry-safe).",
            ["handler", "queue", "outcome"],
            registry=r,
        )
        self.run_times = RunTimes()
        r.register(self.run_times)
        self.lateness = TickHistogram(
            "scheduler_dispatch_lateness_seconds",
            "From a task's slot to its job's dispatch.",
            LATENESS_BUCKETS,
        )
        self.tick_duration = TickHistogram(
            "scheduler_tick_duration_seconds", "Time one tick took.", TICK_BUCKETS
        )
        r.register(self.lateness)
        r.register(self.tick_duration)
        self.decisions = Counter(
            "scheduler_tick_decisions",
            "Rows decided by the tick, by decision.",
            ["decision"],
            registry=r,
        )
        # (TickReport attribute, its counter child): the decisions are the report's lists.
        self._decision_children = tuple((d, self.decisions.labels(d)) for d in DECISIONS)
        self.database = DatabaseCollector(
            app, app.metrics_settings.cache_seconds if cache_seconds is None else cache_seconds
        )
        r.register(self.database)
        self._outcome_children: dict[tuple[str, str, str], Any] = {}
        # Outcomes come from the app's runners after each commit, one call per batch; the
        # lateness from the worker's tick reports (no signal receiver per job or dispatch).
        self._hook = self._recorded  # the one bound method, so close() can remove it
        app.recorded_hooks.append(self._hook)
        self.known_handlers()

    def known_handlers(self) -> None:
        """Start every registered handler's outcome series at 0 (``increase()`` sees the
        first event)."""
        for name in self.app.registry.names():
            handler = self.app.registry.get(name)
            for outcome in OUTCOMES:
                self.jobs.labels(name, handler.queue if handler else "default", outcome)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.app.recorded_hooks.remove(self._hook)

    # -- events -----------------------------------------------------------------------
    # labels() takes a lock and builds a key on every call: the children are kept at hand.
    # (Plain dict reads and writes are atomic; two threads making one child get the same one.)
    def _recorded(self, committed: list[tuple[Job, str]]) -> None:
        """A batch of outcomes committed: the outcome counter, one ``inc`` per label set."""
        counts: dict[tuple[str, str, str], int] = {}
        for job, outcome in committed:
            key = (job.handler, job.queue, outcome)
            counts[key] = counts.get(key, 0) + 1
        for key, n in counts.items():
            child = self._outcome_children.get(key)
            if child is None:
                child = self._outcome_children[key] = self.jobs.labels(*key)
            child.inc(n)

    def ticked(self, seconds: float, report: TickReport) -> None:
        """One tick of the worker's took ``seconds``: its time, its decisions, and the
        lateness of each fresh dispatch (from its nominal slot to now, just after its
        commit)."""
        self.tick_duration.observe(seconds)
        if report.dispatched_slots:
            now, observe = self.app.clock(), self.lateness.observe
            for slot in report.dispatched_slots:
                observe(max((now - slot).total_seconds(), 0.0))
        for decision, child in self._decision_children:
            names = getattr(report, decision)
            if names:
                child.inc(len(names))

    def ran(self, job: Job, started: datetime, seconds: float) -> None:
        """One attempt's handler ran for ``seconds``, started at ``started`` (wall clock)."""
        wait = max((started - job.run_at).total_seconds(), 0.0)
        self.run_times.series(job.handler, job.queue).observe(seconds, wait)


_made_lock = threading.Lock()


def metrics_for(app: MetricsHost) -> Metrics:
    """The one :class:`Metrics` of ``app`` (made on first use, kept on the app)."""
    with _made_lock:
        found: Metrics | None = getattr(app, "_metrics", None)
        if found is None:
            found = Metrics(app)
            setattr(app, "_metrics", found)  # noqa: B010 - not an attribute MetricsHost declares
        return found


def asgi_app(app: MetricsHost) -> Any:
    """An ASGI app serving ``app``'s metrics as Prometheus text (mount it at ``/metrics``)."""
    return make_asgi_app(registry=metrics_for(app).registry)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No line per scrape on stderr."""


class MetricsServer:
    """The HTTP server of :func:`serve`, on its own daemon thread; :meth:`shutdown` stops it
    at once (and closes its socket).

    Not ``prometheus_client.start_http_server``: its thread polls for a shutdown every half
    second, so each worker stop (each ``run(once=True)`` round) waited up to 0.5 s on it. This
    thread sleeps in ``select`` on the listening socket and on a wake-up socket pair: no
    polling while idle, and a stop is seen immediately."""

    def __init__(self, server: WSGIServer) -> None:
        self.server = server
        self.server_address = server.server_address
        self.server_port: int = server.server_port
        server.timeout = 0.5  # a connection gone before accept() must not block the thread
        self._wake, self._woken = socket.socketpair()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="scheduler-metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.server, selectors.EVENT_READ, "request")
            selector.register(self._woken, selectors.EVENT_READ, "stop")
            while True:
                for key, _events in selector.select():
                    if key.data == "stop":
                        return
                    self.server.handle_request()  # readable: accepts at once, handler thread

    def shutdown(self) -> None:
        """Stop serving (waits for the thread, not for scrapes in flight) and close."""
        if self._closed:
            return
        self._closed = True
        self._wake.send(b"x")
        self._thread.join()
        self.server.server_close()
        self._wake.close()
        self._woken.close()

    def server_close(self) -> None:
        """The same as :meth:`shutdown` (the name ``socketserver`` servers have)."""
        self.shutdown()


def serve(app: MetricsHost, port: int | None = None, host: str | None = None) -> MetricsServer:
    """Serve ``app``'s metrics at ``http://host:port/metrics`` from a daemon thread; returns
    the server (``shutdown()`` stops it)."""
    metrics = metrics_for(app)
    settings = app.metrics_settings
    chosen_port = settings.port if port is None else port
    chosen_host = settings.host if host is None else host
    family, _, _, _, address = socket.getaddrinfo(
        chosen_host, chosen_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True  # a scrape in flight never holds the process up
        address_family = family

    server = MetricsServer(
        make_server(
            str(address[0]),
            chosen_port,
            make_wsgi_app(metrics.registry),
            Server,
            handler_class=_QuietHandler,
        )
    )
    log.info(
        "metrics at http://%s:%s/metrics",
        chosen_host,
        chosen_port,
        extra={"action": "metrics_serving", "port": chosen_port},
    )
    return server
