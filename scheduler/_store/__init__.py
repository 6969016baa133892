"""The store: the engine and its capabilities, the tables, and the adapter that runs
statements on the driver's cursor."""

from .engine import Capabilities, Store, make_engine

__all__ = ["Capabilities", "Store", "make_engine"]
