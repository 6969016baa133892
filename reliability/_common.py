"""What the reliability scripts share: safe database set-up, real worker processes, the table.

Every script talks to loopback servers only and refuses any other URL: it empties the
scheduler's tables in the database it is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

HERE = Path(__file__).resolve().parent
DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/scheduler_reliability"
DEFAULT_MARIADB = "mysql+pymysql://root@127.0.0.1:3306/scheduler_reliability"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


# -- arguments and safety --------------------------------------------------------------------
def parser(doc: str | None, seconds: float | None, url: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0])
    if seconds is not None:
        p.add_argument("--seconds", type=float, default=seconds, help="how long to run")
    p.add_argument(
        "--url",
        default=url,
        help="SQLAlchemy URL of a loopback database (its scheduler tables are emptied)"
        + (f" [default: {url}]" if url else " [default: a new SQLite file]"),
    )
    p.add_argument("--keep", action="store_true", help="keep the working directory")
    return p


def check_loopback(url: str) -> None:
    """Refuse anything but SQLite files and servers on this machine."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return
    hosts = parsed.query.get("host", ())  # a multi-host URL: ?host=A:port&host=B:port
    names = [h.rsplit(":", 1)[0] for h in ([hosts] if isinstance(hosts, str) else hosts)]
    if not names or parsed.host:
        names.append(parsed.host or "")
    if any(name not in LOOPBACK for name in names):
        raise SystemExit(f"refusing {parsed.render_as_string()}: loopback servers only")


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def workdir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"scheduler-{prefix}-"))


def prepare_database(url: str) -> None:
    """Create the database if needed, drop our tables, migrate: a clean, current schema."""
    check_loopback(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        for suffix in ("", "-wal", "-shm"):
            if path and os.path.exists(path + suffix):
                os.remove(path + suffix)
    elif parsed.get_backend_name() == "postgresql" and parsed.database:
        admin = create_engine(parsed.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            found = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": parsed.database}
            ).first()
            if not found:
                conn.execute(text(f'CREATE DATABASE "{parsed.database}"'))
        admin.dispose()
    elif parsed.get_backend_name() in ("mysql", "mariadb") and parsed.database:
        admin = create_engine(parsed.set(database="mysql"), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE IF NOT EXISTS `{parsed.database}`"))
        admin.dispose()
    from scheduler import Scheduler
    from scheduler._model.handlers import Registry
    from scheduler._store.migrate import VERSION_TABLE
    from scheduler._store.tables import metadata

    app = Scheduler(url, registry=Registry())
    try:
        if not is_sqlite(url):
            with app.store.begin() as conn:
                for table in reversed(metadata.sorted_tables):
                    conn.execute(text(f"DROP TABLE IF EXISTS {table.name}"))
                conn.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))
        app.migrate()
    finally:
        app.close()


# -- configuration files ---------------------------------------------------------------------
def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(type(value))


def write_config(
    path: Path,
    url: str,
    *,
    scheduler: dict[str, Any] | None = None,
    worker: dict[str, Any] | None = None,
    tasks: Iterable[dict[str, Any]] = (),
    database: dict[str, Any] | None = None,
) -> Path:
    lines = ["[database]", f"url = {_toml(url)}"]
    lines += [f"{k} = {_toml(v)}" for k, v in (database or {}).items()]
    lines += ["", "[scheduler]"]
    lines += [f"{k} = {_toml(v)}" for k, v in (scheduler or {}).items()]
    lines += ["", "[worker]", f"imports = {_toml(['reliability_jobs'])}"]
    lines += [f"{k} = {_toml(v)}" for k, v in (worker or {}).items()]
    for task in tasks:
        lines += ["", "[[tasks]]"] + [f"{k} = {_toml(v)}" for k, v in task.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- processes -------------------------------------------------------------------------------
def child_env(url: str, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env["RELIABILITY_OUT"] = str(out)
    env["SCHEDULER_DATABASE_URL"] = url  # wins over the file, and over the caller's own
    env.pop("SCHEDULER_CONFIG", None)
    return env


def cli(config: Path, *args: str, url: str, out: Path) -> subprocess.CompletedProcess[str]:
    """Run one ``scheduler`` command to completion."""
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "--config", str(config), *args],
        env=child_env(url, out),
        capture_output=True,
        text=True,
        timeout=120,
    )


class Worker:
    """A real ``scheduler worker`` process, its output in ``out/logs/<name>.log``."""

    def __init__(
        self, config: Path, url: str, out: Path, name: str, *args: str, level: str = "WARNING"
    ) -> None:
        self.name = name
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self.log = out / "logs" / f"{name}.log"
        self._log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "scheduler.cli",
                "--config",
                str(config),
                "--log-level",
                level,
                "worker",
                *args,
            ],
            env=child_env(url, out),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the script only
        )
        self.pid = self.proc.pid
        self.killed = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            self.killed = True
        self.proc.wait()
        self._log.close()

    def terminate(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.killed = True
            code = self.proc.wait()
        self._log.close()
        return code

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def stop_all(workers: Iterable[Worker], grace: float) -> dict[str, int]:
    """SIGTERM every live worker, then wait (SIGKILL after ``grace``); name -> exit code."""
    workers = list(workers)
    for w in workers:
        w.terminate()
    deadline = time.monotonic() + grace
    return {w.name: w.wait(max(0.1, deadline - time.monotonic())) for w in workers}


def wait_for(predicate: Any, timeout: float, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return bool(predicate())


# -- what the children wrote -------------------------------------------------------------------
def read_jsonl(folder: Path) -> Iterator[dict[str, Any]]:
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def tracebacks(logs: Iterable[str]) -> int:
    return sum(text.count("Traceback (most recent call last)") for text in logs)


# -- the table ---------------------------------------------------------------------------------
@dataclass
class Figure:
    name: str
    value: Any
    must_be_zero: bool = False

    @property
    def failed(self) -> bool:
        return self.must_be_zero and self.value != 0


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def print_table(title: str, figures: list[Figure], notes: Iterable[str] = ()) -> int:
    """Print the figures; return 1 if a must-be-0 figure is not 0, else 0."""
    width = max(len(f.name) for f in figures)
    values = [fmt(f.value) for f in figures]
    vwidth = max(5, *(len(v) for v in values))
    print()
    print(title)
    print(f"  {'figure':<{width}}  {'value':>{vwidth}}  must be 0")
    print(f"  {'-' * width}  {'-' * vwidth}  ---------")
    for f, v in zip(figures, values, strict=True):
        flag = ("yes  FAIL" if f.failed else "yes  ok") if f.must_be_zero else ""
        print(f"  {f.name:<{width}}  {v:>{vwidth}}  {flag}".rstrip())
    for note in notes:
        print(f"  {note}")
    failed = [f.name for f in figures if f.failed]
    print(f"  result: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}")
    sys.stdout.flush()
    return 1 if failed else 0


def finish(title: str, result: tuple[list[Figure], list[str]], out: Path, keep: bool) -> int:
    """Print the table; keep the working directory on a failure or when asked, else remove it."""
    figures, notes = result
    code = print_table(title, figures, notes)
    if keep or code:
        print(f"  work dir kept: {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)
    return code


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Producer(threading.Thread):
    """Enqueue jobs at a steady rate; retry each one until the database acknowledges it."""

    def __init__(
        self, url: str, rate: float, seed: int, sleeps: tuple[float, float] = (0.05, 0.5)
    ) -> None:
        from scheduler import Scheduler
        from scheduler._model.handlers import Registry

        super().__init__(name="producer", daemon=True)
        self.app = Scheduler(url, registry=Registry())
        self.rate = rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.acked: dict[int, tuple[int, str]] = {}  # n -> (job id, handler)
        self.refused = 0  # enqueue attempts that raised (the database was away)
        self.n = 0
        self.sleeps = sleeps

    def run(self) -> None:
        while not self.stop.is_set():
            self.n += 1
            handler = self.rng.choice(["rel.safe", "rel.unsafe"])
            payload = {"n": self.n, "sleep": round(self.rng.uniform(*self.sleeps), 3)}
            while True:  # the same job until acknowledged; the dedupe key makes it idempotent
                try:
                    job_id = self.app.enqueue(
                        handler,
                        payload,
                        dedupe_key=f"n-{self.n}",
                        max_attempts=10 if handler == "rel.safe" else 3,
                    )
                    self.acked[self.n] = (job_id, handler)
                    break
                except Exception:
                    self.refused += 1
                    if self.stop.wait(0.2):
                        return
            self.stop.wait(1.0 / self.rate)
