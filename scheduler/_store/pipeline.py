"""PostgreSQL (psycopg): one statement run for many parameter sets at once over several
connections, from the calling thread, each execution a transaction of its own.

A tick's fresh dispatches are one statement each (``postgres.build_dispatch``), and each must
commit on its own (each due row is its own transaction). Run one after another, every row
waits for its commit's WAL flush; run on several connections at once, the commits that wait
together share a flush. Python
threads for that cost more than the statements here (each hand-off of the GIL, psycopg's
Python layers per execution), so this module drives the connections' libpq handles
(``psycopg.Connection.pgconn``, psycopg's public low-level interface) directly: it sends the
next parameter set to whichever connection is free and waits on all their sockets at once.

The SQL is SQLAlchemy's, compiled for the connection's dialect with ``$n`` placeholders; the
dialect renders a cast on every placeholder (``$1::INTEGER``), so the values go as text and the
server types them. Each value goes through its column type's bind processor first, as in
``Connection.execute``. The statement is prepared once per connection (kept in the pooled
connection's ``info``), unless the connection was made with ``prepare_threshold=None`` (as
behind PgBouncer in transaction mode). Cursor events fire for every execution, so statement
counters see them (each connection's listeners are taken once per run). A driver error comes
back as SQLAlchemy's exception for that parameter set (a lost connection is invalidated); the
other sets still run on the other connections.

Behind a transaction pooler (``[database] pooler = "transaction"``) a session setting would
land on whichever server connection the pooler picked, so each execution carries its own:
the connection is put in libpq's pipeline mode for it, and the transaction's settings
(``engine.local_settings``), the statement and a Sync go together, one round trip, one
implicit transaction (everything before a Sync is one).
"""

from __future__ import annotations

import hashlib
import selectors
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, Dialect
from sqlalchemy.sql import ClauseElement

from .driver import Prepared, cursor_events, driver_error, with_paramstyle
from .engine import LOCAL_SETTINGS_KEY


class _Unsent:
    def __repr__(self) -> str:
        return "UNSENT"


UNSENT: Final[Any] = _Unsent()
"""What :meth:`Spread.run` returns for an item it stopped before sending."""

_PREPARED_KEY = "scheduler_prepared"  # in a pooled connection's info: names prepared on it


def _number(value: Any, _encoding: str) -> bytes:
    return str(value).encode()


# Keyed by builtin types only: freezegun replaces ``datetime.datetime`` with its FakeDatetime
# while time is frozen (in every loaded module's namespace too), so a ``datetime`` key taken
# at import would be the fake class when the scheduler is first imported under frozen time,
# and every real datetime would find no encoder after. Datetimes are told by ``isinstance``
# at call time (FakeDatetime is a subclass, and its metaclass counts real ones as instances).
_TEXT: dict[type, Callable[[Any, str], bytes | None]] = {
    type(None): lambda _value, _encoding: None,
    bool: lambda value, _encoding: b"t" if value else b"f",
    int: _number,
    float: _number,
    str: lambda value, encoding: value.encode(encoding),
}


def _text(value: Any, encoding: str) -> bytes | None:
    """A bound value as PostgreSQL's text input (the SQL casts each placeholder)."""
    dump = _TEXT.get(type(value))
    if dump is not None:
        return dump(value, encoding)
    if isinstance(value, datetime):
        return value.isoformat(sep=" ").encode()
    # a subclass (an IntEnum, a str subclass): its nearest known base
    base = next((base for base in type(value).__mro__ if base in _TEXT), None)
    if base is None:
        raise TypeError(f"no text form for a {type(value).__name__} parameter")
    return _TEXT[base](value, encoding)


class Spread:
    """One statement compiled for one PostgreSQL dialect, with ``$n`` placeholders."""

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        numbered = with_paramstyle(dialect, "numeric_dollar")
        self._bound = Prepared(statement, dialect, compile_as=numbered)
        self.sql = self._bound.sql
        self.sql_bytes = self.sql.encode()
        self.name = b"scheduler_" + hashlib.sha1(self.sql_bytes).hexdigest()[:16].encode()

    def arguments(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(self._bound.arguments(params))

    def run(
        self,
        conns: Iterable[Connection],
        items: Sequence[Any],
        params: Callable[[Any], Mapping[str, Any]] = dict,
        *,
        stop_on_none: bool = False,
    ) -> list[Any]:
        """Run the statement once for each item, with parameters ``params(item)``, each in its
        own transaction, over `conns` at once; return per item, in order, the first column of
        its first row (None if it returned none) or the SQLAlchemy exception it raised.

        `conns` (outside any transaction) is taken lazily: the first connection is sent its
        first item before the next connection is taken (a pool checkout), and no more are
        taken than there are items. An item no connection could run (all lost) gets the last
        connection's error. With `stop_on_none`, no item is sent after one returned no row
        (those in flight finish); the items never sent get :data:`UNSENT`."""
        if not items:
            return []
        results: list[Any] = [None] * len(items)
        pending = deque(range(len(items)))
        lanes: list[_Lane] = []
        lost: BaseException | None = None
        stopped = False
        with selectors.DefaultSelector() as selector:

            def start(lane: _Lane) -> None:
                if pending and lane.usable and not stopped:
                    index = pending.popleft()
                    lane.send(index, params(items[index]))
                    selector.register(lane.socket, selectors.EVENT_READ, lane)

            try:
                offered = iter(conns)
                while pending and (conn := next(offered, None)) is not None:
                    lane = _Lane(self, conn)
                    lanes.append(lane)
                    lost = lane.open() or lost
                    start(lane)
                if not lanes:
                    raise ValueError("Spread.run needs at least one connection")
                while selector.get_map():
                    for key, _events in selector.select():
                        lane = key.data
                        if lane.receive(results):
                            selector.unregister(lane.socket)
                            if not lane.usable:
                                lost = results[lane.index]
                            elif stop_on_none and results[lane.index] is None:
                                stopped = True
                            start(lane)
            except BaseException:
                for lane in lanes:  # a statement still in flight: the connection is unusable
                    if lane.busy:
                        lane.conn.invalidate()
                raise
        for index in pending:  # stopped, or no connection was left to run them
            results[index] = UNSENT if stopped else lost
        return results


class _Lane:
    """One connection's side of :meth:`Spread.run`: at most one execution in flight."""

    def __init__(self, spread: Spread, conn: Connection) -> None:
        if conn.in_transaction():
            raise RuntimeError("Spread.run needs connections outside a transaction")
        self.spread = spread
        self.conn = conn
        driver: Any = conn.connection.driver_connection
        self.pgconn: Any = driver.pgconn
        self.encoding: str = driver.info.encoding
        #: The transaction's settings, sent before each execution (behind a pooler), or None.
        self.local: bytes | None = conn.connection.info.get(LOCAL_SETTINGS_KEY)
        self.prepared = driver.prepare_threshold is not None and self.local is None
        self.socket = -1
        self.cursor = conn.connection.cursor()  # for the cursor events' signature
        self.events = cursor_events(conn)  # once per run: a lookup per execution costs more
        self.usable = True
        self.busy = False
        self.index = -1
        self.args: tuple[Any, ...] = ()
        self.retried = False
        self.results = 0  # in pipeline mode: results read of the execution in flight
        self.outcome: Any = None  # in pipeline mode: the execution's result so far

    def open(self) -> BaseException | None:
        """Get ready to send: the socket, and the statement prepared on this connection unless
        it is (one round trip, once per connection). The error if that failed, and then the
        lane is not used."""
        from psycopg import OperationalError

        try:
            self.socket = self.pgconn.socket
            return self.prepare()
        except OperationalError as exc:  # the connection is lost
            self.usable = False
            return driver_error(self.conn, self.spread.sql, (), exc)

    def prepare(self) -> BaseException | None:
        if not self.prepared:
            return None
        from psycopg import pq

        names: set[bytes] = self.conn.connection.info.setdefault(_PREPARED_KEY, set())
        if self.spread.name in names:
            return None
        result = self.pgconn.prepare(self.spread.name, self.spread.sql_bytes)
        if result.status != pq.ExecStatus.COMMAND_OK and _sqlstate(result) != _DUPLICATE:
            self.usable = False
            return self.error(result)
        names.add(self.spread.name)
        return None

    def send(self, index: int, params: Mapping[str, Any]) -> None:
        spread, conn = self.spread, self.conn
        self.index = index
        self.args = spread.arguments(params)
        for listener in self.events[0]:
            listener(conn, self.cursor, spread.sql, self.args, None, False)
        self.retried = False
        self._transmit()

    def _transmit(self) -> None:
        encoding = self.encoding
        # NULLs and text, most of a dispatch's values, without a call each (a tick sends ~20
        # values per row)
        values = [
            None
            if value is None
            else value.encode(encoding)
            if type(value) is str
            else _text(value, encoding)
            for value in self.args
        ]
        pgconn = self.pgconn
        if self.local is not None:
            pgconn.enter_pipeline_mode()
            pgconn.send_query_params(self.local, None)
            pgconn.send_query_params(self.spread.sql_bytes, values)
            pgconn.pipeline_sync()
            self.results = 0
        elif self.prepared:
            pgconn.send_query_prepared(self.spread.name, values)
        else:
            pgconn.send_query_params(self.spread.sql_bytes, values)
        self.busy = True
        while self.pgconn.flush():  # a few hundred bytes: the socket takes them at once
            pass

    def receive(self, results: list[Any]) -> bool:
        """Read what arrived; True once the execution in flight is done (result or error)."""
        from psycopg import OperationalError, pq

        pgconn = self.pgconn
        if self.local is not None:
            return self._receive_pipeline(results)
        outcome: Any = None
        try:
            pgconn.consume_input()
            if pgconn.is_busy():
                return False
            missing = False
            while (result := pgconn.get_result()) is not None:
                if result.status == pq.ExecStatus.TUPLES_OK:
                    value = result.get_value(0, 0) if result.ntuples else None
                    outcome = None if value is None else int(value)
                elif result.status != pq.ExecStatus.COMMAND_OK:
                    missing = _sqlstate(result) == _NO_SUCH_STATEMENT
                    outcome = self.error(result)
            if missing and not self.retried:
                # The session lost its prepared statements (DISCARD ALL, DEALLOCATE): nothing
                # ran, so prepare again and send the same values once more.
                self.retried = True
                self.conn.connection.info.pop(_PREPARED_KEY, None)
                failed = self.prepare()
                if failed is None:
                    self._transmit()
                    return False
                outcome = failed
        except OperationalError as exc:  # the connection broke
            outcome = driver_error(self.conn, self.spread.sql, self.args, exc)
        self._settle(results, outcome)
        return True

    def _receive_pipeline(self, results: list[Any]) -> bool:
        """:meth:`receive` in pipeline mode: the settings' result, the statement's, the Sync."""
        from psycopg import OperationalError, pq

        pgconn = self.pgconn
        try:
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:  # the end of one query's results
                    continue
                status = result.status
                if status == pq.ExecStatus.PIPELINE_SYNC:
                    pgconn.exit_pipeline_mode()
                    break
                self.results += 1
                if status == pq.ExecStatus.FATAL_ERROR:
                    self.outcome = self.error(result)
                    if self.conn.invalidated:  # closed: nothing more to read
                        break
                elif self.results == 2:  # the statement's (the settings' came first)
                    if status == pq.ExecStatus.TUPLES_OK:
                        value = result.get_value(0, 0) if result.ntuples else None
                        self.outcome = None if value is None else int(value)
                    elif status != pq.ExecStatus.PIPELINE_ABORTED:  # aborted: settings failed
                        self.outcome = self.error(result)
            else:
                return False
        except OperationalError as exc:  # the connection broke
            self.outcome = driver_error(self.conn, self.spread.sql, self.args, exc)
        outcome, self.outcome = self.outcome, None
        self._settle(results, outcome)
        return True

    def _settle(self, results: list[Any], outcome: Any) -> None:
        """The statement's outcome is in: the connection is free again, a failed one is usable
        only if it was not closed, a success is told to the after-execute listeners."""
        self.busy = False
        results[self.index] = outcome
        if isinstance(outcome, BaseException):
            self.usable = not self.conn.invalidated
        else:
            for listener in self.events[1]:
                listener(self.conn, self.cursor, self.spread.sql, self.args, None, False)

    def error(self, result: Any) -> BaseException:
        """SQLAlchemy's exception for a failed result (a lost connection is invalidated)."""
        import psycopg
        from psycopg import errors, pq

        message = (result.error_message or b"").decode(errors="replace").strip()
        cls: type[Exception] = psycopg.DatabaseError
        sqlstate = _sqlstate(result)
        if self.pgconn.status == pq.ConnStatus.BAD:
            cls = psycopg.OperationalError
        elif sqlstate:
            try:
                cls = errors.lookup(sqlstate)
            except KeyError:
                pass
        return driver_error(self.conn, self.spread.sql, self.args, cls(message))


_DUPLICATE = "42P05"  # duplicate_prepared_statement: prepared already (info was lost)
_NO_SUCH_STATEMENT = "26000"  # invalid_sql_statement_name


def _sqlstate(result: Any) -> str | None:
    from psycopg import pq

    raw = result.error_field(pq.DiagnosticField.SQLSTATE)
    return raw.decode() if raw else None
