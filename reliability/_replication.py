"""A PostgreSQL primary and a synchronous streaming standby of our own, on free loopback ports.

Made with PostgreSQL's own binaries (Debian: ``/usr/lib/postgresql/<version>/bin``): ``initdb``
for the primary, ``pg_basebackup -R`` for the standby (which writes its ``primary_conninfo``
and ``standby.signal``), both run by ``pg_ctl`` as the ``postgres`` OS user when this process
is root (PostgreSQL refuses to run as root). Once the standby streams, the primary gets
``synchronous_standby_names = '*'`` (with ``ALTER SYSTEM``, so the standby, copied before,
does not have it: promoted, it does not wait for a standby of its own): a commit returns once
the standby has it too.

- :meth:`Pair.failover`: ``kill -9`` of the primary's postmaster, then ``pg_ctl promote`` of the
  standby.
- :meth:`Pair.switchover`: the primary stays up and turns read-only
  (``default_transaction_read_only = on`` and a reload, as a demoted primary answers: its
  sessions' next transactions refuse writes with SQLSTATE 25006), then the standby is promoted.

Clients use :meth:`Pair.url`: both hosts with ``target_session_attrs=read-write``, so a new
connection goes to whichever server accepts writes. Everything is stopped (``pg_ctl stop -m
immediate``, or ``kill -9`` of the postmasters this object started) and removed by
:meth:`Pair.stop`. Used by ``tests/store/test_failover.py`` and ``reliability/failover.py``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from _pgbouncer import free_port

OS_USER = "postgres"
DATABASE = "scheduler_failover"


def bindir() -> Path | None:
    """PostgreSQL's binaries (the newest installed version), or None."""
    override = os.environ.get("SCHEDULER_PG_BINDIR")
    candidates = [override] if override else sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    for found in reversed(candidates):
        if found and (Path(found) / "initdb").exists() and (Path(found) / "pg_ctl").exists():
            return Path(found)
    return None


def _is_postgres(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip().startswith(("postgres", "postmaster"))
    except OSError:
        return False


class Server:
    """One cluster: its data directory, port and postmaster."""

    def __init__(self, pair: Pair, name: str) -> None:
        self.pair = pair
        self.name = name
        self.data = pair.dir / name
        self.port = 0
        self.killed = False  # by kill -9: its postmaster.pid is stale (the pid may be reused)

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (first line of ``postmaster.pid``), None when not running."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def conninfo(self, database: str = DATABASE) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def sql(self, statement: str, database: str = DATABASE) -> str:
        """Run one statement with psql (autocommit); its output, unaligned."""
        return self.pair.run(
            [
                str(self.pair.bin / "psql"),
                "-X",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.conninfo(database),
                "-c",
                statement,
            ],
            as_postgres=False,
        ).strip()

    def start(self) -> None:
        self.pair.run(
            [
                str(self.pair.bin / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.pair.dir / f"{self.name}.log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )

    def stop(self) -> None:
        pid = self.pid
        if pid is None or self.killed:
            return
        stop = ["-m", "immediate", "-w", "-t", "30", "stop"]
        pg_ctl = [*self.pair.prefix, str(self.pair.bin / "pg_ctl"), "-D", str(self.data), *stop]
        result = subprocess.run(pg_ctl, capture_output=True, text=True)
        if result.returncode != 0 and self.pid == pid and _is_postgres(pid) and not self.killed:
            try:
                os.kill(pid, signal.SIGKILL)  # the postmaster this object started
            except ProcessLookupError:
                pass

    def is_primary(self) -> bool:
        return self.sql("SELECT pg_is_in_recovery()", "postgres") == "f"


class Pair:
    """A primary and its synchronous standby (see the module's docstring)."""

    def __init__(self, workdir: Path | None = None, *, synchronous: bool = True) -> None:
        found = bindir()
        if found is None:
            raise FileNotFoundError(
                "PostgreSQL's binaries (initdb, pg_ctl) are not installed"
                " (Debian: apt-get install postgresql)"
            )
        self.bin = found
        self.synchronous = synchronous
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="scheduler-failover-"))
        self.root = os.geteuid() == 0
        self.prefix = ["runuser", "-u", OS_USER, "--"] if self.root else []
        self.primary = Server(self, "primary")
        self.standby = Server(self, "standby")

    def run(self, command: list[str], *, as_postgres: bool = True) -> str:
        full = [*self.prefix, *command] if as_postgres else command
        result = subprocess.run(full, capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:2])} failed: {result.stderr.strip()[-800:]}")
        return result.stdout

    def url(self, database: str = DATABASE, driver: str = "postgresql+psycopg") -> str:
        """Both servers, writes only: ``target_session_attrs=read-write``."""
        hosts = "&".join(f"host=127.0.0.1:{s.port}" for s in (self.primary, self.standby))
        return f"{driver}://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    def start(self) -> Pair:
        if self.root:
            shutil.chown(self.dir, OS_USER)
        primary, standby = self.primary, self.standby
        primary.port, standby.port = free_port(), free_port()
        initdb = ["-D", str(primary.data), "-U", "postgres", "--auth=trust", "--no-sync"]
        self.run([str(self.bin / "initdb"), *initdb, "-E", "UTF8", "--locale=C"])
        settings = [
            f"port = {primary.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.dir}'",
            "wal_level = replica",
            "max_wal_senders = 5",
            "hot_standby = on",
            "fsync = off",  # a kill -9 of the postmaster loses nothing the OS has
            "full_page_writes = off",
            "shared_buffers = 32MB",
            "max_connections = 200",
            "wal_sender_timeout = 5s",
            "wal_receiver_status_interval = 1s",
            "cluster_name = 'scheduler-failover'",
        ]
        with open(primary.data / "postgresql.conf", "a") as conf:
            conf.write("\n" + "\n".join(settings) + "\n")
        primary.start()
        primary.sql(f"CREATE DATABASE {DATABASE}", "postgres")
        source = f"host=127.0.0.1 port={primary.port} user=postgres application_name=standby"
        backup = ["-D", str(standby.data), "-R", "-X", "stream", "-c", "fast", "-d", source]
        self.run([str(self.bin / "pg_basebackup"), *backup])
        with open(standby.data / "postgresql.conf", "a") as conf:
            conf.write(f"\nport = {standby.port}\n")
        standby.start()
        deadline = time.monotonic() + 60
        while primary.sql("SELECT count(*) FROM pg_stat_replication", "postgres") != "1":
            if time.monotonic() > deadline:
                raise RuntimeError("the standby did not start streaming within 60 s")
            time.sleep(0.1)
        if self.synchronous:
            primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'", "postgres")
            primary.sql("SELECT pg_reload_conf()", "postgres")
            deadline = time.monotonic() + 30
            while primary.sql("SELECT sync_state FROM pg_stat_replication", "postgres") != "sync":
                if time.monotonic() > deadline:
                    raise RuntimeError("the standby did not become synchronous within 30 s")
                time.sleep(0.1)
        return self

    def promote(self) -> None:
        """Promote the standby (``pg_ctl promote -w``: returns once it accepts writes)."""
        self.run([str(self.bin / "pg_ctl"), "-D", str(self.standby.data), "-w", "promote"])

    def failover(self) -> float:
        """``kill -9`` the primary's postmaster, promote the standby; the promotion's end
        (``time.time()``)."""
        pid = self.primary.pid
        if pid is not None and not self.primary.killed:
            os.kill(pid, signal.SIGKILL)  # the postmaster this object started
            self.primary.killed = True
        self.promote()
        return time.time()

    def demote_primary(self) -> None:
        """The primary turns read-only, staying up: its sessions' next transactions refuse
        writes (SQLSTATE 25006), and a new ``read-write`` connection passes it over."""
        self.primary.sql("ALTER SYSTEM SET default_transaction_read_only = on", "postgres")
        self.primary.sql("SELECT pg_reload_conf()", "postgres")

    def switchover(self) -> float:
        """The primary turns read-only (staying up), then the standby is promoted; the
        promotion's end (``time.time()``)."""
        self.demote_primary()
        self.promote()
        return time.time()

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            server.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Pair:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
