"""The ASGI application: Starlette routes, Jinja2 templates (autoescaped), sessions and CSRF.

Read-only by default. Actions need ``[dashboard] actions = true`` *and* a signed-in user; each is
a POST with the session's CSRF token. When credentials are configured, every page needs a
signed-in user. Every response carries a strict Content-Security-Policy: no inline script runs,
so even a string that slipped past escaping could not execute.

The routes are split by page, as the queries (``_queries.py``, ``_views.py``), the rendering
(``_render.py``) and the counts (``_counts.py``) are: ``_page_tasks.py`` (Tasks, Task),
``_page_jobs.py`` (Jobs, Job), ``_page_present.py`` (Running, Queues),
``_page_health.py``, ``_page_audit.py``, ``_signin.py`` and
``_actions.py``, each with its ``routes(dash)``; what they share is ``_state.py``.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from .._config import DashboardSettings
from . import (
    _actions,
    _bulk,
    _page_audit,
    _page_health,
    _page_jobs,
    _page_present,
    _page_task_form,
    _page_tasks,
    _signin,
)
from ._auth import credentials_match
from ._render import HERE
from ._state import Dashboard

if TYPE_CHECKING:
    from .._app import Scheduler

SECRET_ENV = "SCHEDULER_DASHBOARD_SECRET"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
PAGES = (
    _page_tasks,
    _page_jobs,
    _page_present,
    _page_health,
    _page_audit,
    _signin,
    _actions,
    _bulk,
    _page_task_form,
)


def create_app(
    app: Scheduler,
    settings: DashboardSettings | None = None,
    *,
    secret: bytes | None = None,
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application (mount it, or serve it with uvicorn).

    ``settings`` default to the ``[dashboard]`` table the app was built from. Sessions are
    signed with ``secret``, else ``$SCHEDULER_DASHBOARD_SECRET``, else a random key (sessions
    then end when the process does).
    """
    settings = settings or getattr(app, "dashboard_settings", None) or DashboardSettings()
    key = secret or os.environ.get(SECRET_ENV, "").encode() or secrets.token_bytes(32)
    dash = Dashboard(app, settings, key)
    app.check_schema()
    routes: list[BaseRoute] = [route for module in PAGES for route in module.routes(dash)]
    routes.append(Mount("/static", StaticFiles(directory=HERE / "static"), name="static"))
    metrics = _metrics_endpoint(app, dash.creds)
    if metrics is not None:
        routes.append(Route("/metrics", metrics))
    web = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)])
    web.state.dashboard = dash
    return web


def _metrics_endpoint(
    app: Scheduler, creds: tuple[str, str] | None
) -> Callable[[Request], Awaitable[Response]] | None:
    """``/metrics`` (Prometheus text) when ``rerun-scheduler[metrics]`` is installed, else None.

    A scraper has no session: with credentials configured it signs in with HTTP Basic (the
    dashboard's username and password, Prometheus' ``basic_auth``); without, it is as open as
    the worker's ``/metrics``.
    """
    try:
        from ..metrics import metrics_for
    except ImportError:
        return None
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    def allowed(authorization: str) -> bool:
        if creds is None:
            return True
        scheme, _, encoded = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return credentials_match(creds, user, password)

    async def endpoint(request: Request) -> Response:
        # The password hash is slow on purpose: verified off the event loop, like the scrape.
        if not await run_in_threadpool(allowed, request.headers.get("authorization", "")):
            return Response(
                "sign in with HTTP Basic\n",
                status_code=401,
                headers={"www-authenticate": 'Basic realm="scheduler metrics"'},
            )
        body = await run_in_threadpool(generate_latest, metrics_for(app).registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return endpoint


class SecurityHeaders:
    """Adds the Content-Security-Policy and its companions to every response."""

    HEADERS = [
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"same-origin"),
        (b"x-frame-options", b"DENY"),
        (b"cache-control", b"no-store"),
    ]

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)

        await self.app(scope, receive, sending)


__all__ = ["create_app"]
