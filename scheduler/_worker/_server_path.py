"""Imported first by the fork server of process isolation (``isolation.preload``): puts the
worker's ``sys.path`` in place there. multiprocessing hands the server the parent's path but
does not apply it, so a handler's module found through a path the worker added (its
``[worker] imports``, a test's folder) would not import in the server, and every child would
import it anew. The path comes in the environment the server is started with."""

from __future__ import annotations

import json
import os
import sys

VARIABLE = "SCHEDULER_ISOLATION_SYS_PATH"

_given = os.environ.get(VARIABLE)
if _given:
    _parent = [str(each) for each in json.loads(_given)]
    sys.path[:] = _parent + [each for each in sys.path if each not in _parent]
