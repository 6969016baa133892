"""The dashboard of an app, driven over HTTP by Starlette's TestClient."""

from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient

from scheduler import Scheduler
from scheduler._config import DashboardSettings
from scheduler.dashboard import create_app


def client(app: Scheduler, **settings: Any) -> TestClient:
    return TestClient(create_app(app, DashboardSettings(**settings)), follow_redirects=False)
