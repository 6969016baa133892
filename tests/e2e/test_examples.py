"""The web examples as users run them: ``examples/fastapi_app.py`` under a real uvicorn server
process and ``examples/flask_app.py`` under Flask's own server, driven over HTTP.

A placed order and its receipt job exist together, the job runs in the server's own
background worker (the order shows ``receipt_sent``); an order that fails after the enqueue
leaves neither; the server stops cleanly on SIGTERM (exit 0, its worker row gone).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from sqlalchemy import create_engine, func, select, text

from scheduler import Scheduler
from scheduler._model.handlers import Registry
from scheduler._store.tables import jobs, workers

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clear_orders(url: str) -> None:
    """The shop's table outlives a test on the servers (one schema per pytest process)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE IF EXISTS shop_orders"))
    finally:
        engine.dispose()


def orders_count(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM shop_orders")).scalar_one())
    finally:
        engine.dispose()


def serve(command: list[str], url: str, port: int) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx2.get(f"http://127.0.0.1:{port}/orders/0", timeout=5)
                break
            except httpx2.TransportError:
                if server.poll() is not None:
                    pytest.fail(f"the server exited {server.returncode}:\n{server.stdout.read()}")  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.2)
        yield server
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=30)


def drive(url: str, port: int, server: subprocess.Popen[str]) -> str:
    """Place orders over HTTP, check the database, stop the server; its output."""
    base = f"http://127.0.0.1:{port}"
    sched = Scheduler(url, registry=Registry())
    try:
        placed = httpx2.post(f"{base}/orders", json={"item": "book"}, timeout=10)
        assert placed.status_code == 201, placed.text
        order, job = placed.json()["order_id"], placed.json()["job_id"]
        found = sched.get_job(job)
        assert found is not None and found.payload == {"order_id": order}

        deadline = time.monotonic() + 30  # the server's own background worker runs it
        while not httpx2.get(f"{base}/orders/{order}", timeout=5).json()["receipt_sent"]:
            assert time.monotonic() < deadline, "the receipt job never ran"
            time.sleep(0.2)
        # The handler's own write commits before the worker records the job's outcome (its
        # transaction after the handler returns): the receipt can show first.
        while (state := sched.get_job(job).state) != "succeeded":  # type: ignore[union-attr]
            assert state == "claimed" and time.monotonic() < deadline, state
            time.sleep(0.05)

        failed = httpx2.post(f"{base}/orders", json={"item": "pen", "fail": True}, timeout=10)
        assert failed.status_code == 500
        assert orders_count(url) == 1  # the failed order rolled back...
        with sched.store.read() as conn:  # ...and its job with it
            assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 1
            assert conn.execute(select(func.count()).select_from(workers)).scalar_one() >= 1

        server.send_signal(signal.SIGTERM)
        # uvicorn re-raises the signal once it has shut down: its exit is -SIGTERM
        assert server.wait(60) in (0, -signal.SIGTERM)
        with sched.store.read() as conn:  # the worker unregistered (its tick stays on record)
            ids = list(conn.execute(select(workers.c.id)).scalars())
        assert all(worker.endswith(":tick") for worker in ids), ids
        assert server.stdout is not None
        return server.stdout.read()
    finally:
        sched.close()


def test_the_fastapi_example_under_uvicorn(db_url: str) -> None:
    clear_orders(db_url)
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--port", str(port)]
    for server in serve(command, db_url, port):
        output = drive(db_url, port, server)
        assert "Application shutdown complete." in output  # the lifespan's exit ran


def test_the_flask_example_under_its_server(db_url_sp: str) -> None:
    clear_orders(db_url_sp)
    port = free_port()
    command = [sys.executable, "examples/flask_app.py", str(port)]
    for server in serve(command, db_url_sp, port):
        drive(db_url_sp, port, server)
        assert server.returncode == 0  # SIGTERM acts as Ctrl-C: app.run() returned
