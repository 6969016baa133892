"""A PgBouncer of our own, in transaction mode, in front of a PostgreSQL server on this machine.

Debian's ``pgbouncer`` (``apt-get install pgbouncer``), started as a real process on a free
loopback port, with its configuration, log and auth file in a directory of its own; stopped
(SIGTERM, then SIGKILL) by the process that started it. The tests (``tests/conftest.py``, one
per pytest process) and ``reliability/pooler_load.py`` use it.

Each ``[databases]`` entry may set the ``search_path`` of every server connection the pooler
opens for it (``connect_query``): PgBouncer does not pass a client's ``options`` startup
parameter on, so that is how a schema of one's own is chosen behind it. (The scheduler itself
sets nothing for the session behind a pooler: see ``[database] pooler``.)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

PGBOUNCER = "pgbouncer"
USER = "postgres"


def binary() -> str | None:
    """The ``pgbouncer`` executable, or None when it is not installed."""
    return shutil.which(PGBOUNCER) or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)),
        None,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """One ``pgbouncer`` process in ``pool_mode = transaction``.

    ``databases`` maps a name clients connect to onto (server database, schema or None);
    ``pool_size`` server connections per (database, user), at most.
    """

    def __init__(
        self,
        databases: Mapping[str, tuple[str, str | None]],
        *,
        server_host: str = "127.0.0.1",
        server_port: int = 5432,
        pool_size: int = 4,
        max_client_conn: int = 1000,
        workdir: Path | None = None,
    ) -> None:
        self.databases = dict(databases)
        self.server_host = server_host
        self.server_port = server_port
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self._own_dir = workdir is None
        self.dir = workdir or Path(tempfile.mkdtemp(prefix="scheduler-pgbouncer-"))
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, database: str, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{USER}@127.0.0.1:{self.port}/{database}"

    @property
    def log_path(self) -> Path:
        return self.dir / "pgbouncer.log"

    def _write_config(self) -> Path:
        entries = []
        for name, (dbname, schema) in self.databases.items():
            entry = f"{name} = host={self.server_host} port={self.server_port} dbname={dbname}"
            if schema is not None:
                entry += f" connect_query='SET search_path TO {schema}'"
            entries.append(entry)
        (self.dir / "userlist.txt").write_text(f'"{USER}" ""\n')
        config = self.dir / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    *entries,
                    "",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.dir / 'userlist.txt'}",
                    "pool_mode = transaction",
                    f"default_pool_size = {self.pool_size}",
                    "min_pool_size = 0",
                    "reserve_pool_size = 0",
                    f"max_client_conn = {self.max_client_conn}",
                    f"max_db_connections = {self.pool_size}",
                    "server_reset_query =",
                    "ignore_startup_parameters = extra_float_digits",
                    "server_login_retry = 1",
                    "query_wait_timeout = 60",
                    f"admin_users = {USER}",
                    f"logfile = {self.log_path}",
                    "log_connections = 0",
                    "log_disconnections = 0",
                    "",
                ]
            )
        )
        return config

    def start(self, timeout: float = 15.0) -> PgBouncer:
        exe = binary()
        if exe is None:
            raise FileNotFoundError(
                "pgbouncer is not installed (Debian: apt-get install pgbouncer)"
            )
        self.port = free_port()
        config = self._write_config()
        command = [exe, str(config)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root: as the postgres user
            shutil.chown(self.dir, USER)
            for path in self.dir.iterdir():
                shutil.chown(path, USER)
            command = [exe, "-u", USER, str(config)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                log = self.log_path.read_text() if self.log_path.exists() else ""
                raise RuntimeError(f"pgbouncer exited at start: {err.strip()} {log[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on port {self.port} within {timeout:g}s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)  # its own pid: the one we started
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process is not None and process.stderr is not None:
            process.stderr.close()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
