"""PostgreSQL: ``pg_notify`` in the announcing transaction, and a worker's connection of its
own that listens (``LISTEN``)."""

from __future__ import annotations

import select
from typing import Any

from sqlalchemy import Engine, String, bindparam, func, literal_column, text

from ._common import parse_payload
from ._process import Waiter
from ._sources import PipedSource

LISTEN_APPLICATION_NAME = "scheduler-listen"  # pg_stat_activity's name of the LISTEN connection

# The channel: 'scheduler:' and the schema the unqualified tables are found in (63 bytes at
# most, PostgreSQL's identifier length), computed by the server on both sides.
CHANNEL_SQL = "left('scheduler:' || current_schema(), 63)"
NOTIFY = text(
    f"SELECT pg_notify({CHANNEL_SQL}, payload) FROM unnest(CAST(:payloads AS text[])) AS payload"
)

#: ``pg_notify`` as a column of the enqueue's ``INSERT ... RETURNING`` (:func:`folds`): the
#: notification rides in the statement that writes the job, no round trip of its own.
NOTIFY_COLUMN = func.pg_notify(
    literal_column(CHANNEL_SQL), bindparam("p_wakeup", type_=String())
).label("wakeup")


def have_psycopg() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


def listen_connect_args(url: str | None, engine: Engine) -> tuple[list[Any], dict[str, Any]]:
    """psycopg's connect arguments for the LISTEN connection: ``url`` (``listen_url``) or the
    engine's, named ``scheduler-listen`` (unless the URL names it), with TCP keepalives so
    that a connection cut without a word is noticed."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url) if url is not None else engine.url
    dialect = engine.dialect if url is None else parsed.get_dialect()()
    args, kwargs = dialect.create_connect_args(parsed)
    kwargs = dict(kwargs)
    query = parsed.query
    if "application_name" not in query:
        kwargs["application_name"] = LISTEN_APPLICATION_NAME
    if "connect_timeout" not in query:
        kwargs["connect_timeout"] = 5
    for key, value in (("keepalives", 1), ("keepalives_idle", 10), ("keepalives_interval", 5)):
        if key not in query:
            kwargs[key] = value
    if "keepalives_count" not in query:
        kwargs["keepalives_count"] = 3
    return list(args), kwargs


class PostgresSource(PipedSource):
    name = "the LISTEN connection"

    def __init__(self, url: str | None, engine: Engine, waiter: Waiter) -> None:
        super().__init__(waiter)
        self.url = url
        self.engine = engine
        self.backend_pid: int | None = None  # the LISTEN connection's server process (tests)

    def _serve(self) -> None:
        import psycopg
        from psycopg import pq, sql

        args, kwargs = listen_connect_args(self.url, self.engine)
        self._client = conn = psycopg.connect(*args, autocommit=True, **kwargs)
        row = conn.execute(f"SELECT {CHANNEL_SQL}, pg_backend_pid()").fetchone()
        assert row is not None
        channel, self.backend_pid = row
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        self._connected()
        pgconn = conn.pgconn
        while not self._stop.is_set():
            ready, _, _ = select.select([pgconn.socket, self._pipe[0]], [], [], 60.0)
            if self._pipe[0] in ready:
                return
            pgconn.consume_input()
            if pgconn.status != pq.ConnStatus.OK:
                raise psycopg.OperationalError("the server closed the LISTEN connection")
            while (note := pgconn.notifies()) is not None:
                found = parse_payload(note.extra.decode())
                if found is not None:
                    self.waiter.notice(*found)
