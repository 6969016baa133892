"""Statements run straight on the driver's cursor, for the tick's per-row hot path.

A Core statement executed through ``Connection.execute`` costs about 20 µs of Python before the
driver sees it (cache lookup, parameter processing, result set-up); the driver itself needs 2 µs.
The tick's dispatch runs two such statements per due row in its own transaction, so on SQLite
that overhead was a third of a dispatch. Here SQLAlchemy still writes the SQL (compiled once per
dialect from our Core constructs) and still converts every value with the column's own type,
and the connection's cursor events still fire (statement counters, echo), but the execution
goes to the cursor directly. Driver errors come back as SQLAlchemy's ``DBAPIError`` classes,
and a lost connection invalidates the SQLAlchemy connection, as ``Connection.execute`` would.

Only statements whose every bound value is a named parameter (no literal values, no
expanding IN) are accepted.

Where the connection accepts several statements in one query (MariaDB/MySQL through PyMySQL,
which ``engine.make_engine`` connects with ``MULTI_STATEMENTS``), :meth:`Prepared.joined` sends
a row's statements in one round trip, and :meth:`Prepared.run_all` reads each one's result
with the driver's ``nextset`` (DB-API's optional extension).

This module is the one place that relies on SQLAlchemy behaviour outside its public API: the
compiled statement's ``binds`` and ``positiontup``, a bind type's ``dialect_impl`` processor,
the connection's ``dispatch`` of cursor listeners (called with the signature
``Connection.execute`` uses), ``DBAPIError.instance``, ``Pool._invalidate`` (what
``Connection.execute`` calls on a disconnect), and a dialect class made again with another
``paramstyle``. tests/store/test_driver.py pins each of them
(``test_the_sqlalchemy_behaviour_this_adapter_relies_on``), so an upgrade that changes one
fails a test, not a tick.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

READ_ONLY_SQLSTATES = frozenset({"25006"})
"""PostgreSQL's read_only_sql_transaction: "cannot execute UPDATE in a read-only transaction"
(a demoted primary, ``default_transaction_read_only = on``) and "cannot execute nextval()
during recovery" (a hot standby)."""

READ_ONLY_MESSAGES = ("recovery is in progress", "conflict with recovery")
"""What else a standby answers: a function that needs a primary (SQLSTATE 55000) and a
statement canceled by a hot-standby conflict (40001)."""

MYSQL_READ_ONLY = frozenset({1290, 1792, 1836})
"""ER_OPTION_PREVENTS_STATEMENT (``--read-only``), ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION,
ER_READ_ONLY_MODE."""


def read_only_server(exc: BaseException) -> bool:
    """The server refused a statement because it is read-only or in recovery: after a
    switchover or a failover the connection talks to a server that is no longer the primary.
    Such a connection is lost to us, like a cut one (the pool is emptied and the next
    connection goes to the primary: a multi-host URL with ``target_session_attrs=read-write``)."""
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(state, str):
        if state in READ_ONLY_SQLSTATES:
            return True
        if state in ("55000", "40001"):
            text = str(exc)
            return any(message in text for message in READ_ONLY_MESSAGES)
        return False
    args = getattr(exc, "args", ())
    code = getattr(exc, "errno", None) or (args[0] if args else None)
    return isinstance(code, int) and code in MYSQL_READ_ONLY


def driver_error(
    conn: Connection, statement: str, arguments: Any, exc: Exception, cursor: Any = None
) -> StatementError:
    """The SQLAlchemy exception ``Connection.execute`` would raise for the driver's `exc`;
    a lost connection (or one to a server that turned read-only) is invalidated first, with
    the pool's other connections, as ``Connection.execute`` does, so the pool replaces them."""
    dialect = conn.dialect
    error: Any = exc  # one of the driver's DB-API errors
    lost = dialect.is_disconnect(error, conn.connection.dbapi_connection, cursor)
    lost = lost or read_only_server(exc)
    if lost:
        fairy = conn.connection
        conn.invalidate(exc)
        # Connections made before now are replaced when next checked out (SQLAlchemy's
        # Pool._invalidate, what Connection.execute calls on a disconnect).
        conn.engine.pool._invalidate(fairy, exc, _checkin=False)
    return DBAPIError.instance(
        statement,
        arguments,
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=lost,
        dialect=dialect,
    )


def _cursor_events(
    listeners: Any, conn: Connection, cursor: Any, statement: str, arguments: Any
) -> None:
    if listeners:
        for listener in listeners:
            listener(conn, cursor, statement, arguments, None, False)


def before_cursor(conn: Connection, cursor: Any, statement: str, arguments: Any) -> None:
    """Run `conn`'s ``before_cursor_execute`` listeners, as ``Connection.execute`` does before
    the driver's execute (statement counters, echo)."""
    _cursor_events(conn.dispatch.before_cursor_execute, conn, cursor, statement, arguments)


def after_cursor(conn: Connection, cursor: Any, statement: str, arguments: Any) -> None:
    """Run `conn`'s ``after_cursor_execute`` listeners, as ``Connection.execute`` does after
    the driver's execute."""
    _cursor_events(conn.dispatch.after_cursor_execute, conn, cursor, statement, arguments)


CursorEvents = tuple[tuple[Callable[..., Any], ...], tuple[Callable[..., Any], ...]]
"""A connection's ``before_cursor_execute`` and ``after_cursor_execute`` listeners."""


def cursor_events(conn: Connection) -> CursorEvents:
    """`conn`'s cursor listeners now: for the statements of one transaction, so that each does
    not look them up again (a lookup costs more than a listener-less statement's own Python).
    A listener added after this call is not called for them."""
    dispatch = conn.dispatch
    return tuple(dispatch.before_cursor_execute), tuple(dispatch.after_cursor_execute)


def with_paramstyle(dialect: Dialect, paramstyle: str) -> Dialect:
    """A dialect of `dialect`'s class that writes SQL with another `paramstyle`."""
    make: Any = type(dialect)
    made: Dialect = make(paramstyle=paramstyle)
    return made


def _remember_last(process: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`process` with its last input and output kept: a tick passes the same objects for
    every row (its `now`, the memoised next slot of a shared cron expression), and converting
    a datetime costs more than the identity check. Values here are immutable; the pair is one
    tuple, so threads sharing a statement never see an input with another's output."""
    last: list[tuple[Any, Any]] = [(object(), None)]

    def remembered(value: Any) -> Any:
        seen, out = last[0]
        if value is seen:
            return out
        out = process(value)
        last[0] = (value, out)
        return out

    return remembered


T = TypeVar("T")


class Prepared:
    """One statement compiled for one dialect, run on the cursor of a Connection."""

    __slots__ = ("_dialect", "_fixed", "_names", "_positional", "_steps", "sql")

    def __init__(
        self,
        statement: ClauseElement,
        dialect: Dialect,
        *,
        compile_as: Dialect | None = None,
        prefix: str = "",
        literals: bool = False,
    ) -> None:
        """`compile_as`: a dialect to write the SQL with instead (another paramstyle); the
        values still go through `dialect`'s type processors. `prefix`: SQL written before the
        statement's own (MariaDB's ``SET STATEMENT ... FOR``). `literals`: the statement's
        literal values (``literal()``, a ``values()`` constant) are accepted too, sent as
        parameters of fixed value (named paramstyles only)."""
        compiled = statement.compile(dialect=compile_as or dialect)
        assert isinstance(compiled, SQLCompiler)
        self._positional = (compile_as or dialect).positional
        fixed: dict[str, Any] = {}
        if literals and not self._positional:
            binds = {name: bind for bind, name in compiled.bind_names.items()}
            for name, bind in binds.items():
                if bind.expanding:
                    raise ValueError(f"parameter {name!r} must not be expanding")
                if not bind.required:
                    fixed[name] = bind.effective_value
        else:
            binds = dict(compiled.binds)
            for name, bind in binds.items():
                if not bind.required or bind.expanding:
                    raise ValueError(f"parameter {name!r} must be a plain required bindparam")
        self.sql = prefix + compiled.string
        self._dialect = dialect
        if self._positional:
            self._names: tuple[str, ...] = tuple(compiled.positiontup or ())
        else:
            self._names = tuple(name for name in binds if name not in fixed)
        processors: dict[str, Callable[[Any], Any]] = {}
        for name, bind in binds.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = _remember_last(process)
        # Per parameter, in the driver's order: its name and its processor (None: as it is).
        self._steps = tuple((name, processors.get(name)) for name in self._names)
        # The literal values, converted once.
        self._fixed = {
            name: value if processors.get(name) is None else processors[name](value)
            for name, value in fixed.items()
        }

    @classmethod
    def joined(cls, *parts: Prepared) -> Prepared:
        """`parts` sent as one query, their SQL joined by ``;``: one round trip for several
        statements, where the connection accepts that (PyMySQL with ``MULTI_STATEMENTS``,
        ``engine.multi_statements``). One dialect and paramstyle; with named parameters, a
        name the parts share is one value (its first part's type converts it). Run it with
        :meth:`run_all`."""
        first = parts[0]
        positional = first._positional
        if any(p._positional != positional or p._dialect is not first._dialect for p in parts):
            raise ValueError("only statements of one dialect and paramstyle can be joined")
        steps = [step for part in parts for step in part._steps]
        if not positional:  # one value per name
            first_seen: dict[str, Callable[[Any], Any] | None] = {}
            for name, process in steps:
                first_seen.setdefault(name, process)
            steps = list(first_seen.items())
        made = object.__new__(cls)
        made.sql = ";".join(part.sql for part in parts)
        made._dialect = first._dialect
        made._positional = positional
        made._steps = tuple(steps)
        made._names = tuple(name for name, _process in steps)
        made._fixed = {}
        for part in parts:
            made._fixed.update(part._fixed)
        return made

    def arguments(self, params: Mapping[str, Any]) -> Any:
        """The driver's arguments for `params`: each value through its column type."""
        values = [
            params[name] if process is None else process(params[name])
            for name, process in self._steps
        ]
        if self._positional:
            return tuple(values)
        named = dict(zip(self._names, values, strict=True))
        if self._fixed:
            named.update(self._fixed)
        return named

    def run(
        self,
        conn: Connection,
        params: Mapping[str, Any],
        cursor: Any = None,
        events: CursorEvents | None = None,
    ) -> Any:
        """Execute on `conn`'s current transaction; return the driver's cursor (`cursor`, one
        this transaction's earlier statement returned, is used again: a row's statements
        share one). `events`: :func:`cursor_events` of `conn`, taken once for several
        statements (else looked up for this one)."""
        arguments = self.arguments(params)
        if cursor is None:
            cursor = conn.connection.cursor()
        sql = self.sql
        if events is None:
            before_cursor(conn, cursor, sql, arguments)
        else:
            for listener in events[0]:
                listener(conn, cursor, sql, arguments, None, False)
        try:
            cursor.execute(sql, arguments)
        except self._dialect.loaded_dbapi.Error as exc:
            raise driver_error(conn, sql, arguments, exc, cursor) from exc
        if events is None:
            after_cursor(conn, cursor, sql, arguments)
        else:
            for listener in events[1]:
                listener(conn, cursor, sql, arguments, None, False)
        return cursor

    def run_all(
        self,
        conn: Connection,
        params: Mapping[str, Any],
        cursor: Any = None,
        events: CursorEvents | None = None,
    ) -> list[tuple[int, Any]]:
        """Run a :meth:`joined` query as :meth:`run` does; per statement, in order, the rows it
        affected and the id it generated (the driver's ``lastrowid``). Every result is read,
        so the connection is ready for the next query; a statement that fails raises here,
        and the server ran none after it."""
        cursor = self.run(conn, params, cursor, events)
        results = [(cursor.rowcount, cursor.lastrowid)]
        try:
            while cursor.nextset():
                results.append((cursor.rowcount, cursor.lastrowid))
        except self._dialect.loaded_dbapi.Error as exc:
            raise driver_error(conn, self.sql, params, exc, cursor) from exc
        return results


class PreparedSet(Generic[T]):
    """A statement compiled lazily, once per dialect object (one per engine), by `make` (a
    :class:`Prepared`, or ``_pgspread.Spread``) from what `build` returns for the dialect."""

    def __init__(
        self, build: Callable[[str], ClauseElement], make: Callable[[ClauseElement, Dialect], T]
    ) -> None:
        self._build = build
        self._make = make
        self._by_dialect: weakref.WeakKeyDictionary[Dialect, T] = weakref.WeakKeyDictionary()

    def on(self, conn: Connection) -> T:
        dialect = conn.dialect
        made = self._by_dialect.get(dialect)
        if made is None:
            made = self._make(self._build(dialect.name), dialect)
            self._by_dialect[dialect] = made
        return made
