"""A Citus cluster of our own: a coordinator and worker nodes on free loopback ports.

Made with PostgreSQL's own binaries (Debian: ``/usr/lib/postgresql/<version>/bin``, the version
Citus is built for: ``../shared/tools/install-citus.sh`` builds it for 15), as in
``_replication.py``: ``initdb`` and ``pg_ctl`` run as the ``postgres`` OS user when this process
is root. Each node preloads ``citus`` and has ``CREATE EXTENSION citus`` in the database
:data:`DATABASE`; the coordinator knows itself (``citus_set_coordinator_host``) and its workers
(``citus_add_node``). The nodes talk to each other over loopback without TLS
(``citus.node_conninfo``), and allow prepared transactions, so that a statement that needs a
two-phase commit gets one (and shows in ``pg_dist_transaction``) instead of failing.

:meth:`Cluster.distributed_schema` creates a Citus distributed schema (schema-based sharding):
its tables live together on one worker node, and a statement that stays inside it is routed to
that node. Everything is stopped (``pg_ctl stop -m immediate``, or ``kill -9`` of the
postmasters this object started) and removed by :meth:`Cluster.stop`. A process killed before
it could stop its cluster leaves it running: the next cluster's start stops and removes those
whose owner (the pid in their ``owner`` file) is gone (:func:`reap_orphans`). Used by the tests
(``tests/helpers/citus_cluster.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _pgbouncer import free_port
from _replication import OS_USER, _is_postgres

DATABASE = "scheduler_citus"
PG_VERSION = "15"  # the PostgreSQL that install-citus.sh builds Citus for
BINDIR = Path(os.environ.get("SCHEDULER_CITUS_BINDIR", f"/usr/lib/postgresql/{PG_VERSION}/bin"))


def problem() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    if not (BINDIR / "initdb").exists() or not (BINDIR / "pg_ctl").exists():
        return f"PostgreSQL {PG_VERSION}'s binaries (initdb, pg_ctl) are not in {BINDIR}"
    libdir = subprocess.run(
        [str(BINDIR / "pg_config"), "--pkglibdir"], capture_output=True, text=True
    ).stdout.strip() or str(BINDIR.parent / "lib")
    if not (Path(libdir) / "citus.so").exists():
        return (
            f"Citus is not installed for PostgreSQL {PG_VERSION} (no {libdir}/citus.so;"
            " run ../shared/tools/install-citus.sh as root)"
        )
    return None


PREFIX = "scheduler-citus-"  # the clusters' directories in the temporary directory


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans() -> list[Path]:
    """Stop and remove the clusters whose owning process is gone (killed before its
    :meth:`Cluster.stop`); the directories removed."""
    reaped = []
    for found in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = int((found / "owner").read_text())
        except (OSError, ValueError):
            continue  # being made, or not one of ours
        if _alive(owner):
            continue
        for data in sorted(found.iterdir()):
            if (data / "postmaster.pid").exists():
                stop = [str(BINDIR / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]
                prefix = ["runuser", "-u", OS_USER, "--"] if os.geteuid() == 0 else []
                subprocess.run([*prefix, *stop], capture_output=True, timeout=60)
        shutil.rmtree(found, ignore_errors=True)
        reaped.append(found)
    return reaped


class Node:
    """One PostgreSQL server of the cluster: its data directory, port and postmaster."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.data = cluster.dir / name
        self.port = free_port()

    @property
    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def url(self, database: str = DATABASE, driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = DATABASE) -> str:
        """Run one statement with psql (autocommit); its output, unaligned."""
        conninfo = f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"
        psql = [str(BINDIR / "psql"), "-X", "-At", "-v", "ON_ERROR_STOP=1", "-d", conninfo]
        return self.cluster.run([*psql, "-c", statement], as_postgres=False).strip()

    def initdb(self) -> subprocess.Popen[str]:
        initdb = [str(BINDIR / "initdb"), "-D", str(self.data), "-U", "postgres"]
        options = ["--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"]
        return subprocess.Popen(
            [*self.cluster.prefix, *initdb, *options],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def configure(self) -> None:
        settings = [
            f"port = {self.port}",
            "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.cluster.dir}'",
            f"shared_preload_libraries = '{','.join(('citus', *self.cluster.preload))}'",
            "citus.node_conninfo = 'sslmode=disable'",
            "max_prepared_transactions = 100",
            "wal_level = logical",  # a shard moved while it is written (citus_move_shard_placement)
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "shared_buffers = 32MB",
            "max_connections = 200",
            "max_worker_processes = 20",
            f"cluster_name = 'scheduler-citus-{self.name}'",
        ]
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\n" + "\n".join(settings) + "\n")

    def start(self) -> None:
        log = str(self.cluster.dir / f"{self.name}.log")
        start = [str(BINDIR / "pg_ctl"), "-D", str(self.data), "-l", log, "-w", "-t", "60"]
        self.cluster.run([*start, "start"])

    def stop(self) -> None:
        pid = self.pid
        if pid is None:
            return
        stop = [str(BINDIR / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        result = subprocess.run([*self.cluster.prefix, *stop], capture_output=True, text=True)
        if result.returncode != 0 and self.pid == pid and _is_postgres(pid):
            try:
                os.kill(pid, 9)  # the postmaster this object started
            except ProcessLookupError:
                pass


class Cluster:
    """A Citus coordinator and ``workers`` worker nodes (see the module's docstring)."""

    def __init__(self, workers: int = 2, preload: tuple[str, ...] = ()) -> None:
        found = problem()
        self.preload = preload  # more shared_preload_libraries, after citus
        if found is not None:
            raise FileNotFoundError(found)
        reap_orphans()
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX))
        (self.dir / "owner").write_text(str(os.getpid()))
        self.root = os.geteuid() == 0
        self.prefix = ["runuser", "-u", OS_USER, "--"] if self.root else []
        self.coordinator = Node(self, "coordinator")
        self.workers = [Node(self, f"worker{i}") for i in range(workers)]

    @property
    def nodes(self) -> list[Node]:
        return [self.coordinator, *self.workers]

    def run(self, command: list[str], *, as_postgres: bool = True) -> str:
        full = [*self.prefix, *command] if as_postgres else command
        result = subprocess.run(full, capture_output=True, text=True, timeout=180)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:2])} failed: {result.stderr.strip()[-800:]}")
        return result.stdout

    def url(self, schema: str | None = None, driver: str = "postgresql+psycopg") -> str:
        """The coordinator's URL (clients always connect to it), with ``search_path`` set to
        ``schema`` if given."""
        url = self.coordinator.url(driver=driver)
        return url if schema is None else f"{url}?options=-csearch_path%3D{schema}"

    def start(self) -> Cluster:
        started = time.monotonic()
        if self.root:
            shutil.chown(self.dir, OS_USER)
        made = [node.initdb() for node in self.nodes]  # in parallel: each takes about a second
        for node, process in zip(self.nodes, made, strict=True):
            _, stderr = process.communicate(timeout=180)
            if process.returncode != 0:
                raise RuntimeError(f"initdb of {node.name} failed: {stderr.strip()[-800:]}")
            node.configure()
        for node in self.nodes:
            node.start()
            node.sql(f"CREATE DATABASE {DATABASE}", "postgres")
            node.sql("CREATE EXTENSION citus")
        coordinator = self.coordinator
        coordinator.sql(f"SELECT citus_set_coordinator_host('127.0.0.1', {coordinator.port})")
        for worker in self.workers:
            coordinator.sql(f"SELECT citus_add_node('127.0.0.1', {worker.port})")
        self.started_in = time.monotonic() - started
        return self

    def distributed_schema(self, schema: str) -> None:
        """Create ``schema`` as a Citus distributed schema (schema-based sharding), unless it
        exists."""
        self.coordinator.sql(
            f"SET citus.enable_schema_based_sharding TO on; CREATE SCHEMA IF NOT EXISTS {schema}"
        )

    def create_database(self, name: str, *, schema_sharding: bool = True) -> str:
        """Create the database `name` on every node, with Citus and the cluster's nodes in it
        (Citus keeps its metadata per database: a database is a cluster of its own), and with
        ``schema_sharding`` ``citus.enable_schema_based_sharding`` on for its sessions
        (``ALTER DATABASE``: a ``CREATE SCHEMA`` there makes a distributed schema). Its URL on
        the coordinator."""
        for node in self.nodes:
            node.sql(f"CREATE DATABASE {name}", "postgres")
            node.sql("CREATE EXTENSION citus", name)
        coordinator = self.coordinator
        coordinator.sql(f"SELECT citus_set_coordinator_host('127.0.0.1', {coordinator.port})", name)
        for worker in self.workers:
            coordinator.sql(f"SELECT citus_add_node('127.0.0.1', {worker.port})", name)
        if schema_sharding:
            coordinator.sql(
                f"ALTER DATABASE {name} SET citus.enable_schema_based_sharding TO on", name
            )
        return coordinator.url(name)

    def node_of(self, schema: str, database: str = DATABASE) -> Node:
        """The worker node that holds ``schema``'s tables (a distributed schema with tables)."""
        port = self.coordinator.sql(
            "SELECT DISTINCT nodeport FROM citus_shards"
            f" WHERE split_part(table_name::text, '.', 1) = '{schema}'",
            database,
        )
        for node in self.nodes:
            if str(node.port) == port:
                return node
        raise LookupError(f"no node holds the schema {schema} (found {port!r})")

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
