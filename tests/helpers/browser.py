"""A real browser and a real server for the dashboard's browser tests: Debian's Chromium driven
by Playwright (never downloaded: `.ci/run` installs it with apt) and uvicorn on a free port of
127.0.0.1."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = os.environ.get("SCHEDULER_TEST_CHROMIUM", "/usr/bin/chromium")


@contextmanager
def chromium() -> Iterator[Any]:
    """A launched Chromium; skipped without one, and failed with CI=true."""
    if not os.path.exists(CHROMIUM):
        message = f"Chromium not found at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + "; CI requires it", pytrace=False)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        found = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield found
        finally:
            found.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(asgi: Any) -> Iterator[str]:
    """``asgi`` served by uvicorn in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
