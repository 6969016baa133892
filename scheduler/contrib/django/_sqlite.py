"""SQLAlchemy's SQLite dialect for Django's own connection.

Django opens SQLite connections with ``detect_types`` and registers converters (``datetime``,
``timestamp``, ``bool``, ...) in the ``sqlite3`` module: a ``DATETIME`` column comes back as a
``datetime`` on its connection, where SQLAlchemy's SQLite dialect expects the stored text. This
dialect takes either.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import types as sqltypes
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.sqlite import DATETIME
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

DRIVER = "sqlite+scheduler_django"


class _DateTimeOrText(DATETIME):
    def result_processor(self, dialect: Any, coltype: object) -> Any:
        parse = super().result_processor(dialect, coltype)

        def process(value: Any) -> Any:
            if value is None or isinstance(value, datetime) or parse is None:
                return value
            return parse(value)

        return process


class DjangoSQLiteDialect(SQLiteDialect_pysqlite):
    supports_statement_cache = True
    colspecs = {**SQLiteDialect_pysqlite.colspecs, sqltypes.DateTime: _DateTimeOrText}


registry.register(DRIVER.replace("+", "."), __name__, "DjangoSQLiteDialect")
