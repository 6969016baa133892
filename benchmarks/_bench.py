"""Shared pieces of the benchmark scripts: arguments, databases, counting, processes, tables.

Not part of the ``scheduler`` package. The scripts import it as a sibling module
(``python benchmarks/x.py`` puts ``benchmarks/`` on ``sys.path``).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import queue
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url

DEFAULT_PG = os.environ.get(
    "SCHEDULER_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def noop(*_args: Any, **_kwargs: Any) -> None:
    """The job body every benchmark runs: nothing."""


# -- arguments ------------------------------------------------------------------------------
def parser(description: str, reps: int = 3) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--reps", type=int, default=reps, help=f"repetitions per case (default {reps})")
    p.add_argument(
        "--pg",
        default=DEFAULT_PG,
        help="PostgreSQL URL of an existing database used to CREATE/DROP the benchmark databases"
        " (default $SCHEDULER_BENCH_PG or %(default)s)",
    )
    p.add_argument("--no-pg", action="store_true", help="skip PostgreSQL (SQLite only)")
    p.add_argument("--no-sqlite", action="store_true", help="skip SQLite (PostgreSQL only)")
    return p


# -- databases --------------------------------------------------------------------------------
def pg_url(server: str, database: str) -> str:
    """``server`` with its database name replaced."""
    return make_url(server).set(database=database).render_as_string(hide_password=False)


# Appended to every database name a script creates, so that runs beside each other (another
# checkout's, another person's) never drop each other's databases: SCHEDULER_BENCH_SUFFIX=_mine
SUFFIX = os.environ.get("SCHEDULER_BENCH_SUFFIX", "")


def recreate_pg_database(server: str, database: str) -> str:
    """Drop (forcibly) and create ``database`` (plus the suffix); return its URL."""
    database += SUFFIX
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{database}"'))
    finally:
        admin.dispose()
    return pg_url(server, database)


def checkpoint_pg(server: str) -> None:
    """Write out what loading left dirty (a ``CHECKPOINT``), so that the checkpointer's
    writes and fsyncs do not land on the commits of the first case measured after it."""
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text("CHECKPOINT"))
    finally:
        admin.dispose()


def drop_pg_database(server: str, database: str) -> None:
    database += SUFFIX
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
    finally:
        admin.dispose()


def pg_version(server: str) -> str:
    engine = create_engine(server)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar())
    finally:
        engine.dispose()


def scratch_dir() -> Path:
    """A temporary folder for SQLite files, removed at exit."""
    holder = tempfile.TemporaryDirectory(prefix="scheduler-bench-")
    _KEEP.append(holder)
    return Path(holder.name)


_KEEP: list[Any] = []


# -- counting -----------------------------------------------------------------------------------
@dataclass
class Counts:
    """SQL statements (``BEGIN`` excluded), transactions begun, pool checkouts, and the CPU
    seconds the client process(es) spent (``time.process_time``: user + system)."""

    statements: int = 0
    transactions: int = 0
    checkouts: int = 0
    cpu: float = 0.0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.statements + other.statements,
            self.transactions + other.transactions,
            self.checkouts + other.checkouts,
            self.cpu + other.cpu,
        )

    def per(self, n: int) -> tuple[float, float, float, float]:
        """Statements, transactions, checkouts and CPU microseconds per ``n``."""
        n = max(n, 1)
        return (
            self.statements / n,
            self.transactions / n,
            self.checkouts / n,
            self.cpu * 1e6 / n,
        )


class Counter:
    """Counts what one engine sends: a ``before_cursor_execute`` listener, plus ``begin`` and
    pool ``checkout`` (each checkout costs a round trip on an engine with ``pool_pre_ping``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.counts = Counts()
        self.statements: dict[str, int] = {}
        self.keep_text = False
        event.listen(engine, "before_cursor_execute", self._execute)
        event.listen(engine, "begin", self._begin)
        event.listen(engine.pool, "checkout", self._checkout)

    def _execute(self, _conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if statement.lstrip()[:5].upper() == "BEGIN":
            return
        self.counts.statements += 1
        if self.keep_text:
            self.statements[statement] = self.statements.get(statement, 0) + 1

    def _begin(self, _conn: Any) -> None:
        self.counts.transactions += 1

    def _checkout(self, *_args: Any) -> None:
        self.counts.checkouts += 1

    def reset(self) -> Counts:
        taken, self.counts = self.counts, Counts()
        return taken

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._execute)
        event.remove(self.engine, "begin", self._begin)
        event.remove(self.engine.pool, "checkout", self._checkout)


# -- processes ----------------------------------------------------------------------------------
def _child(
    setup: Callable[..., Callable[[], tuple[int, Counts]]],
    args: tuple[Any, ...],
    ready: Any,
    start: Any,
    results: Any,
) -> None:
    try:
        go = setup(*args)
        ready.put(None)
        start.wait()
        cpu = time.process_time()
        handled, counts = go()
        counts.cpu = time.process_time() - cpu
        results.put((handled, counts, time.monotonic(), None))
    except BaseException as exc:  # report, never leave the parent waiting
        ready.put(None)
        results.put((0, Counts(), time.monotonic(), f"{type(exc).__name__}: {exc}"))


def start_together(
    target: Callable[..., None], args: tuple[Any, ...], processes: int, what: str
) -> tuple[list[Any], Any, float]:
    """Start ``processes`` fresh (spawned) processes of ``target(*args, ready, start,
    results)``, wait until each has put a token on ``ready`` (its untimed set-up done), then
    release them at once. Returns the processes, the ``results`` queue and the common start
    (``time.monotonic``, system-wide on Linux)."""
    ctx = multiprocessing.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=target, args=(*args, ready, start, results)) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        while True:
            try:
                ready.get(timeout=1)
                break
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a {what} process died while starting") from None
    began = time.monotonic()
    start.set()
    return procs, results, began


def run_processes(
    setup: Callable[..., Callable[[], tuple[int, Counts]]],
    processes: int,
    args: tuple[Any, ...],
) -> tuple[float, int, Counts]:
    """Run a drain in ``processes`` fresh processes started together.

    Each child calls ``setup(*args)`` (connect, import, warm up: not timed), waits for the
    common start, then calls what ``setup`` returned, which gives ``(handled, Counts)``.
    Returns the wall time from the common start to the last finish (``time.monotonic`` is
    system-wide on Linux), the jobs handled, and the summed counts.
    """
    procs, results, began = start_together(_child, (setup, args), processes, "worker")
    handled, counts, last, errors = 0, Counts(), began, []
    for _ in procs:
        n, c, finished, error = results.get(timeout=3600)
        handled += n
        counts = counts + c
        last = max(last, finished)
        if error:
            errors.append(error)
    for p in procs:
        p.join()
    if errors:
        raise RuntimeError("worker process failed: " + "; ".join(errors))
    return last - began, handled, counts


# -- tables -------------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt(value: float, digits: int = 3) -> str:
    if value != value:  # NaN
        return "-"
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def ratio(ours: float, theirs: float) -> str:
    if not theirs or ours != ours or theirs != theirs:
        return "-"
    return f"{ours / theirs:.2f}x"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """One Markdown table, so a run pastes straight into docs/performance.md."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    print(f"\n{title}\n")
    print(line(cells[0]))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        print(line(r))
    print()


def progress(message: str) -> None:
    """Progress goes to stderr, so stdout holds only the table."""
    import sys

    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def source_version() -> str:
    """The checkout measured: ``git describe --always --dirty``, or ``?``."""
    import subprocess

    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return out.stdout.strip()


def load() -> str:
    """The 1-minute load average: other work on the machine skews wall-clock figures."""
    return f"{os.getloadavg()[0]:.1f}"


def machine() -> str:
    """One line about this machine, printed under each table."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {ram} RAM, Python {platform.python_version()},"
        f" SQLite {sqlite3.sqlite_version}, scheduler {source_version()}"
    )


# -- a transaction pooler -----------------------------------------------------------------------
class PgBouncer:
    """Debian's ``pgbouncer`` in transaction mode on a free port, in front of ``server``'s
    PostgreSQL (trust authentication, as the local server here): started by the script, ended
    by it (its own process id). ``url(database)`` is the URL through it."""

    def __init__(self, server: str, pool_size: int = 20, binary: str = "/usr/sbin/pgbouncer"):
        import shutil
        import socket
        import subprocess

        found = shutil.which("pgbouncer") or binary
        if not Path(found).exists():
            raise RuntimeError("pgbouncer is not installed (Debian: apt-get install pgbouncer)")
        target = make_url(server)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = target
        self.dir = Path(tempfile.mkdtemp(prefix="scheduler-bench-pgbouncer-"))
        self.dir.chmod(0o755)
        user = target.username or "postgres"
        (self.dir / "userlist.txt").write_text(f'"{user}" ""\n')
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={target.host or '127.0.0.1'} port={target.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.dir / 'userlist.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 1000\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
        )
        for f in self.dir.iterdir():
            f.chmod(0o644)
        command = [found, str(self.dir / "pgbouncer.ini")]
        stop_on_sigterm()
        if os.geteuid() == 0:  # it refuses to run as root; its log goes in the folder
            import pwd

            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            command[1:1] = ["-u", "postgres"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"pgbouncer did not start: see {self.dir}") from None
                time.sleep(0.1)

    def url(self, database: str) -> str:
        through = self.server.set(host="127.0.0.1", port=self.port, database=database)
        return through.render_as_string(hide_password=False)

    def close(self) -> None:
        import shutil

        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def stop_on_sigterm() -> None:
    """A SIGTERM (``kill PID``, ``timeout``) ends this script by ``SystemExit``, so that its
    ``finally`` blocks stop the servers it started (a PostgreSQL cluster, a pgbouncer), which
    otherwise went on running in their temporary folders. Its child processes keep the
    default: killed at once."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return
    script = os.getpid()

    def ended(signum: int, frame: Any) -> None:
        if os.getpid() != script:  # a forked child inherited this handler
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, ended)


# -- a PostgreSQL cluster of the script's own ----------------------------------------------------
class PgCluster:
    """A PostgreSQL cluster made with ``initdb`` in a temporary folder and started on a free
    port with the server's defaults (autovacuum on), for a benchmark that must see what a
    production server does (the shared test server may run with autovacuum off). Run as the
    ``postgres`` user when started as root; stopped (``pg_ctl stop -m fast``) and removed by
    :meth:`close`. ``settings``: extra ``-c name=value`` for the server."""

    def __init__(
        self,
        settings: dict[str, str] | None = None,
        bindir: str = "/usr/lib/postgresql/15/bin",
    ) -> None:
        import pwd
        import shutil
        import socket
        import subprocess

        if not Path(bindir, "initdb").exists():
            raise RuntimeError(f"no PostgreSQL binaries in {bindir}")
        stop_on_sigterm()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = Path(tempfile.mkdtemp(prefix="scheduler-bench-pg-"))
        self._bindir = bindir
        self._prefix: list[str] = []
        if os.geteuid() == 0:  # the server refuses to run as root
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self._prefix = ["runuser", "-u", "postgres", "--"]
        data = self.dir / "data"
        subprocess.run(
            [
                *self._prefix,
                f"{bindir}/initdb",
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
            check=True,
            capture_output=True,
        )
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.dir),
            **(settings or {}),
        }
        flags = " ".join(f"-c {k}={v}" for k, v in options.items())
        subprocess.run(
            [
                *self._prefix,
                f"{bindir}/pg_ctl",
                "-D",
                str(data),
                "-l",
                str(self.dir / "log"),
                "-o",
                flags,
                "-w",
                "start",
            ],
            check=True,
            capture_output=True,
        )
        self._shutil = shutil
        self.server = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def close(self) -> None:
        import subprocess

        subprocess.run(
            [
                *self._prefix,
                f"{self._bindir}/pg_ctl",
                "-D",
                str(self.dir / "data"),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
            capture_output=True,
        )
        self._shutil.rmtree(self.dir, ignore_errors=True)
