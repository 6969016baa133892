"""Handlers and signal receivers for the reliability scripts (imported by their workers).

The scripts start real ``scheduler worker`` processes whose ``[worker] imports`` name this
module (``reliability/`` is put on ``PYTHONPATH``). Everything a process sees is appended, one
``os.write`` per line on an ``O_APPEND`` descriptor, to files under ``$RELIABILITY_OUT``:

* ``events/<pid>.jsonl``: the signals this process sent (dispatches, reruns, disables, job
  outcomes), one JSON object a line, with the wall-clock time ``t`` it was received;
* ``markers/<pid>.jsonl``: what the handlers did (``start``, ``done``, ``abandoned``), so a
  process killed with ``kill -9`` leaves its side effects on disk.

A line is in the kernel as soon as ``os.write`` returns, so ``kill -9`` never loses one.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from datetime import datetime
from typing import Any

from scheduler import default_registry, signals

OUT = os.environ.get("RELIABILITY_OUT", "")
_lock = threading.Lock()
_files: dict[str, int] = {}


def _append(kind: str, record: dict[str, Any]) -> None:
    if not OUT:
        return
    record.setdefault("t", time.time())
    record["pid"] = os.getpid()
    line = (json.dumps(record, default=_iso, separators=(",", ":")) + "\n").encode()
    with _lock:
        fd = _files.get(kind)
        if fd is None:
            os.makedirs(os.path.join(OUT, kind), exist_ok=True)
            path = os.path.join(OUT, kind, f"{os.getpid()}.jsonl")
            fd = _files[kind] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(fd, line)


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.timestamp()
    return str(value)


def event(record: dict[str, Any]) -> None:
    _append("events", record)


def marker(record: dict[str, Any]) -> None:
    _append("markers", record)


event({"e": "ready"})


# -- handlers ------------------------------------------------------------------------------
class Boom(RuntimeError):
    code = "boom"


@default_registry.handler("rel.fast", retry_safe=True)
def fast(job: Any) -> None:
    time.sleep(random.uniform(0, 0.02))


@default_registry.handler("rel.slow", retry_safe=True)
def slow(job: Any) -> None:
    time.sleep(random.uniform(job.payload.get("min", 0.5), job.payload.get("max", 2.0)))


@default_registry.handler("rel.fail", retry_safe=True, max_attempts=1)
def fail(job: Any) -> None:
    raise Boom(f"job {job.id} always fails")


@default_registry.handler("rel.flaky", retry_safe=True, max_attempts=1)
def flaky(job: Any) -> None:
    if random.random() < job.payload.get("p", 0.4):
        raise Boom(f"job {job.id} failed this time")


def _marked(job: Any) -> None:
    """Record the start, do the 'work' (sleep), record the end: the side effects to count."""
    base = {"job": job.id, "attempt": job.attempt, "handler": job.handler}
    base["n"] = job.payload.get("n")
    marker({**base, "m": "start", "sleep": job.payload.get("sleep", 0)})
    time.sleep(job.payload.get("sleep", 0))
    marker({**base, "m": "done"})


@default_registry.handler("rel.safe", retry_safe=True, max_attempts=10)
def safe(job: Any) -> None:
    _marked(job)


def _unsafe_abandoned(job: Any) -> None:
    marker(
        {
            "job": job.id,
            "attempt": job.attempt,
            "handler": job.handler,
            "m": "abandoned",
            "n": job.payload.get("n"),
        }
    )


@default_registry.handler("rel.unsafe", retry_safe=False, abandoned=_unsafe_abandoned)
def unsafe(job: Any) -> None:
    _marked(job)


# -- signal receivers (module-level: blinker holds them weakly) --------------------------------
@signals.job_dispatched.connect
def on_dispatched(sender: str, **kw: Any) -> None:
    event({"e": "dispatch", "row": kw["row"], "job": kw["job_id"], "slot": kw["slot"]})


@signals.job_rerun.connect
def on_rerun(sender: str, **kw: Any) -> None:
    failures = kw["consecutive_failures"]
    event({"e": "rerun", "row": kw["row"], "job": kw["job_id"], "failures": failures})


@signals.row_disabled.connect
def on_disabled(sender: str, **kw: Any) -> None:
    event(
        {
            "e": "disabled",
            "row": kw["row"],
            "alert_id": kw.get("alert_id"),
            "failures": kw.get("consecutive_failures"),
            "disabled_at": kw.get("disabled_at"),
        }
    )


def _job_event(name: str, job: Any) -> None:
    event(
        {
            "e": name,
            "job": job.id,
            "row": job.task_name,
            "state": job.state,
            "finished_at": job.finished_at,
        }
    )


@signals.job_succeeded.connect
def on_succeeded(sender: str, **kw: Any) -> None:
    _job_event("succeeded", kw["job"])


@signals.job_aborted.connect
def on_aborted(sender: str, **kw: Any) -> None:
    _job_event("aborted", kw["job"])
