"""Citus's own account of where a statement went: with ``citus.log_remote_commands`` on, the
coordinator tells the client each command it sends to a node (a ``LOG`` notice whose ``DETAIL``
names the server). :class:`RemoteCommands` records, for every statement an engine sends, the
commands the coordinator sent to nodes for it (used by ``tests/store/test_citus.py`` and
``tests/store/test_citus_shards.py``)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, event

_SERVER = re.compile(r"on server \S+@([\d.]+):(\d+)")


@dataclass
class Sent:
    """One statement of ours, and the commands the coordinator sent to nodes for it (its
    transaction's ``COMMIT`` included, when that is what follows it): (command, node port)."""

    statement: str
    parameters: Any
    remote: list[tuple[str, int]] = field(default_factory=list)


class RemoteCommands:
    """Every statement an engine sends, with the remote commands Citus logs for it."""

    def __init__(self, engine: Engine) -> None:
        self.sent: list[Sent] = []
        self._current: dict[int, Sent] = {}  # by driver connection
        self._lock = threading.Lock()
        event.listen(engine, "connect", self._on_connect)
        event.listen(engine, "before_cursor_execute", self._on_execute)

    def _on_connect(self, dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("SET citus.log_remote_commands TO on")
        dbapi_connection.execute("SET client_min_messages TO log")
        dbapi_connection.commit()
        key = id(dbapi_connection)
        dbapi_connection.add_notice_handler(lambda diag: self._on_notice(key, diag))

    def _on_execute(
        self, conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any
    ) -> None:
        sent = Sent(statement, parameters)
        with self._lock:
            self._current[id(conn.connection.driver_connection)] = sent
            self.sent.append(sent)

    def _on_notice(self, key: int, diag: Any) -> None:
        found = _SERVER.search(diag.message_detail or "")
        sent = self._current.get(key)
        if found is not None and sent is not None:
            sent.remote.append((diag.message_primary or "", int(found.group(2))))

    @contextmanager
    def during(self) -> Iterator[list[Sent]]:
        """The statements sent inside the ``with`` block."""
        start = len(self.sent)
        found: list[Sent] = []
        yield found
        found.extend(self.sent[start:])


def assert_router(sent: list[Sent], node: int, what: str) -> None:
    """Each statement's remote commands go to `node` only, none is a two-phase commit's; and
    the operation did reach that node."""
    assert sent, f"{what}: no statement"
    for one in sent:
        ports = {port for _, port in one.remote}
        assert ports <= {node}, (what, one.statement, one.remote)
        prepared = [c for c, _ in one.remote if "PREPARE TRANSACTION" in c or "PREPARED" in c]
        assert prepared == [], (what, one.statement, prepared)
    assert any(one.remote for one in sent), f"{what}: nothing reached the worker node"
