"""A worker process for the wake-up tests and benchmark: ``python tests/helpers/wakeup_worker.py URL
OUT [--poll S] [--broker URL] [--concurrency N] [--off]``.

Runs a :class:`~scheduler._worker.Worker` on ``URL`` with one handler, ``wake.stamp``, which
appends ``<job id> <started - payload["t"]> <attempt> <started>`` (seconds, wall clock) to the
file ``OUT`` (and fails its first attempt when the payload says ``fail_first``). With
``--poll`` the safety-net poll is that long (the tests make it long, so that only a wake-up can
start a job quickly). It writes ``READY <listen backend pid or 0>`` to ``OUT.ready`` once it
listens, stops on SIGTERM, and then writes ``<wakes> <heard> <claims>`` to ``OUT.done``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._worker import worker as worker_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("out")
    parser.add_argument("--poll", type=float, default=None)
    parser.add_argument("--broker", default=None)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--off", action="store_true", help="wake-ups off: poll only")
    parser.add_argument("--sleep", type=float, default=0.0, help="each job sleeps this long")
    parser.add_argument("--tick-interval", type=float, default=1.0)
    parser.add_argument("--backoff", type=float, default=60.0, help="retry back-off base (s)")
    args = parser.parse_args()
    if args.poll is not None:
        worker_module.POLL_SECONDS = args.poll
    registry = Registry()
    out = Path(args.out)
    lock = threading.Lock()

    @registry.handler("wake.stamp", retry_safe=True)
    def stamp(job: object) -> None:
        started = time.time()
        payload = getattr(job, "payload", {})
        lag = started - float(payload.get("t", started))
        line = f"{getattr(job, 'id', 0)} {lag:.6f} {getattr(job, 'attempt', 0)} {started:.6f}\n"
        with lock, out.open("a") as file:
            file.write(line)
        if args.sleep:
            time.sleep(args.sleep)
        if payload.get("fail_first") and getattr(job, "attempt", 0) == 1:
            raise RuntimeError("the first attempt fails")

    app = Scheduler(
        args.url,
        registry=registry,
        broker_url=args.broker,
        wakeups=not args.off,
        concurrency=args.concurrency,
        clock="local",
        tick_interval=args.tick_interval,
        backoff_base_seconds=args.backoff,
        backoff_max_seconds=max(args.backoff, 3600.0),
    )
    claims = 0
    worker = worker_module.Worker(app)
    original = worker.runner.claim

    def counted(*a: object, **k: object) -> object:
        nonlocal claims
        claims += 1
        return original(*a, **k)  # type: ignore[arg-type]

    worker.runner.claim = counted  # type: ignore[method-assign]

    def announce_ready() -> None:
        deadline = time.monotonic() + 30
        while worker._listening is None and time.monotonic() < deadline and not args.off:
            time.sleep(0.01)
        pid = 0
        listening = worker._listening
        if listening is not None:
            for source in listening.sources:
                while getattr(source, "backend_pid", 0) is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                pid = getattr(source, "backend_pid", 0) or pid
            # the source has connected (or is a watcher): give it a moment to be listening
            time.sleep(0.2)
        # Written whole, then renamed into place: the test reads it as soon as it exists.
        Path(args.out + ".ready.tmp").write_text(f"READY {pid}\n")
        os.replace(args.out + ".ready.tmp", args.out + ".ready")

    threading.Thread(target=announce_ready, daemon=True).start()
    worker.run(install_signals=True)
    listening = worker._listening
    wakes = heard = 0
    if listening is not None:
        wakes, heard = listening.waiter.wakes, listening.waiter.heard
    Path(args.out + ".done").write_text(f"{wakes} {heard} {claims}\n")
    app.close()
    os._exit(0)


if __name__ == "__main__":
    main()
