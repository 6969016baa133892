"""The store: the only package that names a table or builds a statement. The engine and its
capabilities, the tables, the statements of each part (the queue, the rows, the tick's reads
and writes, the status reads), the migrations' runner, and the wake-ups that ride on the
database's commits.

Upper layers hold a :data:`Connection` only to pass it back in (a transaction the facade
opened, or the caller's); they never build a statement on it.
"""

from sqlalchemy import Connection, Engine

from .engine import Capabilities, Store, make_engine

__all__ = ["Capabilities", "Connection", "Engine", "Store", "make_engine"]
