"""The ASGI application: Starlette routes, Jinja2 templates (autoescaped), sessions and CSRF.

Read-only by default. Actions need ``[dashboard] actions = true`` *and* a signed-in user; each is
a POST with the session's CSRF token. When credentials are configured, every page needs a
signed-in user. Every response carries a strict Content-Security-Policy: no inline script runs,
so even a string that slipped past escaping could not execute.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._config import DashboardSettings
from .._errors import ConfigError, SchedulerError
from .._store import health as _health
from .._store.jobs import STATES
from . import _queries, _views
from ._auth import Signer, credentials, credentials_match
from ._counts import FinishedCounts
from ._render import HERE, _ago, _environment, _pill, _strip, _when

if TYPE_CHECKING:
    from .._app import Scheduler

log = logging.getLogger(__name__)

AUDIT_PAGE = 200  # entries on the Audit page, newest first

COOKIE = "scheduler_dashboard"
SECRET_ENV = "SCHEDULER_DASHBOARD_SECRET"
LIVE_HEADER = "x-dashboard-live"
LIVE_START, LIVE_END = "<!--live-->", "<!--/live-->"  # base.html's live region
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class Dashboard:
    """The routes' shared state: the app, the settings, the signer and the templates."""

    def __init__(self, app: Scheduler, settings: DashboardSettings, secret: bytes) -> None:
        self.app = app
        self.settings = settings
        self.creds = credentials(settings)
        if settings.actions and self.creds is None:
            raise ConfigError(
                "[dashboard]: key 'actions': true needs a signed-in user: set username and"
                " password_hash (`scheduler dashboard --hash-password`)"
            )
        self.signer = Signer(secret)
        self.env = _environment()
        self._status: tuple[float, dict[str, Any]] | None = None
        self._status_lock = threading.Lock()
        self.finished = FinishedCounts(app, settings.refresh_seconds)

    def status(self) -> dict[str, Any]:
        """``_health.overview()``, computed at most once per refresh interval for all viewers:
        three statements, a few milliseconds at 10,000 tasks and a million jobs; one at a time,
        the others wait for it and share its result. The finished states' counts are not in it:
        :attr:`finished` takes them in the background."""
        with self._status_lock:
            found = self._status
            if found is None or time.monotonic() - found[0] >= self.settings.refresh_seconds:
                app = self.app
                app.check_schema()
                data = _health.overview(app.store, app.clock(), app.health_settings())
                found = self._status = (time.monotonic(), data)  # fresh from when it ended
            return found[1]

    # -- sessions -------------------------------------------------------------------------
    def session(self, request: Request) -> dict[str, Any]:
        found = self.signer.loads(request.cookies.get(COOKIE))
        if found is None or not isinstance(found.get("sid"), str):
            found = {"sid": secrets.token_urlsafe(16), "user": None, "new": True}
        if self.creds is not None and found.get("user") != self.creds[0]:
            found["user"] = None  # a cookie from before the username changed
        return found

    def store_session(self, request: Request, response: Response, session: dict[str, Any]) -> None:
        data = {k: v for k, v in session.items() if k in ("sid", "user", "flash")}
        response.set_cookie(
            COOKIE,
            self.signer.dumps(data),
            max_age=int(self.signer.max_age),
            path=(request.scope.get("root_path") or "") + "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def can_act(self, session: dict[str, Any]) -> bool:
        return self.settings.actions and self.creds is not None and bool(session.get("user"))

    # -- rendering -------------------------------------------------------------------------
    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        session = context.pop("_session", None) or self.session(request)
        base = request.scope.get("root_path") or ""
        now = self.app.clock()
        values = {
            "base": base,
            "now": now,
            "ago": lambda value: _ago(value, now),
            "when": lambda value, zone=None: _when(value, zone, now),
            "pill": _pill,
            "strip": lambda cells: _strip(base, cells),
            "user": session.get("user"),
            "login_needed": self.creds is not None,
            "can_act": self.can_act(session),
            "csrf": self.signer.csrf_token(session["sid"]),
            "refresh": self.settings.refresh_seconds,
            "flash": session.pop("flash", None),
            "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            "has_audit": True,
            "states": STATES,
            **context,
        }
        body = self.env.get_template(name).render(values)
        if request.headers.get(LIVE_HEADER) and LIVE_START in body:
            body = body.split(LIVE_START, 1)[1].split(LIVE_END, 1)[0]
        response = HTMLResponse(body, status_code=status)
        if session.get("new") or values["flash"] is not None:
            session.pop("new", None)
            self.store_session(request, response, session)
        return response

    def guard(self, request: Request) -> Response | None:
        """With credentials configured, a page needs a signed-in user."""
        if self.creds is None or self.session(request).get("user"):
            return None
        if request.headers.get(LIVE_HEADER):
            return Response("sign in again", status_code=401)
        base = request.scope.get("root_path") or ""
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"{base}/login?{urlencode({'next': target})}", status_code=303)


def _safe_next(base: str, target: str | None) -> str:
    """Only a path inside the dashboard: never another site (no open redirect)."""
    if (
        target
        and target.startswith(base + "/")
        and not target.startswith("//")
        and "\\" not in target
    ):
        return target
    return base + "/tasks"


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

    def page(fn: Callable[[Request], Response]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            return dash.guard(request) or fn(request)

        endpoint.__name__ = fn.__name__
        return endpoint

    @page
    def index(request: Request) -> Response:
        return RedirectResponse((request.scope.get("root_path") or "") + "/tasks", status_code=303)

    @page
    def tasks(request: Request) -> Response:
        p = request.query_params
        name, state = p.get("name", "").strip(), p.get("state", "")
        state = state if state in _queries.TASK_STATES else ""
        with app.store.read() as conn:
            found = _queries.tasks(
                conn, name=name, state=state, after=p.get("after") or None, now=app.clock()
            )
            strips = _queries.strips(conn, [t["name"] for t in found.items])
        query = {k: v for k, v in (("name", name), ("state", state)) if v}
        return dash.render(
            request,
            "tasks.html",
            {
                "tasks": found.items,
                "strips": strips,
                "filters": {"name": name, "state": state},
                "task_states": _queries.TASK_STATES,
                "next_page": urlencode({**query, "after": found.next_cursor})
                if found.next_cursor is not None
                else None,
                "first_page": urlencode(query) if p.get("after") else None,
            },
        )

    @page
    def task(request: Request) -> Response:
        name = request.path_params["name"]
        data = _views.task_page(app, name, app.clock())
        if data is None:
            return dash.render(request, "missing.html", {"what": f"task {name!r}"}, 404)
        return dash.render(request, "task.html", data)

    @page
    def jobs(request: Request) -> Response:
        p = request.query_params
        filters = {k: p.get(k, "").strip() for k in ("state", "task", "handler", "queue")}
        if filters["state"] not in STATES:
            filters["state"] = ""
        before = p.get("before", "")
        with app.store.read() as conn:
            found = _queries.job_list(
                conn,
                state=filters["state"],
                task=filters["task"],
                handler=filters["handler"],
                queue=filters["queue"],
                before=int(before) if before.isdigit() else None,
            )
        query = {k: v for k, v in filters.items() if v}
        return dash.render(
            request,
            "jobs.html",
            {
                "jobs": found.items,
                "filters": filters,
                "next_page": urlencode({**query, "before": found.next_cursor})
                if found.next_cursor is not None
                else None,
                "first_page": urlencode(query) if before else None,
            },
        )

    @page
    def job(request: Request) -> Response:
        job_id = request.path_params["job_id"]
        with app.store.read() as conn:
            from .._store.jobs import get_job, history

            found = get_job(conn, job_id)
            runs = history(conn, job_id) if found is not None else []
            zone = _queries.task_timezone(conn, found.task_name) if found is not None else None
        if found is None:
            return dash.render(request, "missing.html", {"what": f"job {job_id}"}, 404)
        # A task's job carries the payload its TOML entry gave; of any other job only the
        # keys are shown: their values came from application code, not from this user.
        return dash.render(request, "job.html", {"job": found, "runs": runs, "zone": zone or "UTC"})

    @page
    def health(request: Request) -> Response:
        context = {
            "status": dash.status(),
            "finished": dash.finished.get(),  # never waits: the last counts, with their age
            "finished_every": dash.finished.interval(),
            "finished_states": _health.FINISHED,
            "worker_gone": f"{_health.Thresholds.worker_gone:g}",
        }
        return dash.render(request, "health.html", context)

    @page
    def audit(request: Request) -> Response:
        target = request.query_params.get("target", "").strip()
        try:
            entries = app.audit(target or None, limit=AUDIT_PAGE)
        except SchedulerError:  # no task or job of that name: say so, not "nothing yet"
            what = target if target.startswith("job ") else f"task {target!r}"
            return dash.render(request, "missing.html", {"what": what}, 404)
        return dash.render(request, "audit.html", {"entries": entries, "target": target})

    # -- sign in and out -------------------------------------------------------------------
    def login(request: Request) -> Response:
        base = request.scope.get("root_path") or ""
        target = _safe_next(base, request.query_params.get("next"))
        return dash.render(request, "login.html", {"next": target, "error": None})

    async def login_post(request: Request) -> Response:
        form = await request.form()
        session = dash.session(request)
        base = request.scope.get("root_path") or ""
        target = _safe_next(base, str(form.get("next") or ""))
        if not dash.signer.check_csrf(session["sid"], str(form.get("csrf") or "")) or session.get(
            "new"
        ):
            return Response("missing or stale CSRF token: reload the page", status_code=403)
        user, password = str(form.get("username") or ""), str(form.get("password") or "")
        if not credentials_match(dash.creds, user, password):
            log.warning("dashboard: failed sign-in", extra={"action": "dashboard_login_failed"})
            context = {"next": target, "error": "Wrong username or password.", "_session": session}
            return dash.render(request, "login.html", context, 401)
        fresh = {"sid": secrets.token_urlsafe(16), "user": user}  # a new id: no fixation
        response = RedirectResponse(target, status_code=303)
        dash.store_session(request, response, fresh)
        return response

    async def logout(request: Request) -> Response:
        form = await request.form()
        session = dash.session(request)
        if session.get("new") or not dash.signer.check_csrf(
            session["sid"], str(form.get("csrf") or "")
        ):
            return Response("missing or stale CSRF token: reload the page", status_code=403)
        base = request.scope.get("root_path") or ""
        response = RedirectResponse(base + "/login", status_code=303)
        dash.store_session(request, response, {"sid": secrets.token_urlsafe(16), "user": None})
        return response

    # -- actions ---------------------------------------------------------------------------
    def action(run: Callable[[Request, dict[str, Any], str], str]) -> Callable[..., Any]:
        async def endpoint(request: Request) -> Response:
            form = await request.form()
            session = dash.session(request)
            if not settings.actions:
                return Response("actions are off ([dashboard] actions = false)", status_code=403)
            if not session.get("user") or session.get("new"):
                return Response("sign in to act", status_code=401)
            if not dash.signer.check_csrf(session["sid"], str(form.get("csrf") or "")):
                return Response("missing or stale CSRF token: reload the page", status_code=403)
            reason = str(form.get("reason") or "").strip()[:500]
            try:
                from starlette.concurrency import run_in_threadpool

                message = await run_in_threadpool(run, request, session, reason)
            except SchedulerError as exc:
                message = f"Refused: {exc}"
            base = request.scope.get("root_path") or ""
            response = RedirectResponse(
                _safe_next(base, str(form.get("next") or "")), status_code=303
            )
            dash.store_session(request, response, {**session, "flash": message})
            return response

        return endpoint

    def logged(session: dict[str, Any], act: str, target: str, reason: str) -> None:
        log.info(
            "dashboard: %s %s by %s%s",
            act,
            target,
            session["user"],
            f" ({reason})" if reason else "",
            extra={"action": f"dashboard_{act}", "actor": session["user"], "target": target},
        )

    # Each action passes the signed-in user and the reason to the change itself: its audit
    # entry is written in the change's transaction (a refused action writes none).
    def trigger(request: Request, session: dict[str, Any], reason: str) -> str:
        name = request.path_params["name"]
        app.trigger(name, reason=reason, actor=session["user"])
        logged(session, "trigger", name, reason)
        return f"Triggered {name}: due now, the next tick dispatches it."

    def enable(request: Request, session: dict[str, Any], reason: str) -> str:
        name = request.path_params["name"]
        changed = app.enable(name, reason=reason, actor=session["user"])
        logged(session, "enable", name, reason)
        if not changed:
            return f"{name} was already enabled."
        after = app.get_row(name)
        if after is not None and after.last_job_state == "aborted":
            return (
                f"Enabled {name}, failures reset. Its last job ({after.last_job_id}) is aborted:"
                " its next slot reruns it in place and counts that as failure 1."
            )
        return f"Enabled {name}."

    def disable(request: Request, session: dict[str, Any], reason: str) -> str:
        name = request.path_params["name"]
        if not reason:
            raise SchedulerError("say why: a reason is needed to disable a task")
        app.disable(name, reason=reason, actor=session["user"])
        logged(session, "disable", name, reason)
        return f"Disabled {name}: {reason}"

    def retry(request: Request, session: dict[str, Any], reason: str) -> str:
        job_id = request.path_params["job_id"]
        app.retry_job(job_id, reason=reason, actor=session["user"])
        logged(session, "retry", f"job {job_id}", reason)
        return f"Job {job_id} is queued again, attempts reset."

    def cancel(request: Request, session: dict[str, Any], reason: str) -> str:
        job_id = request.path_params["job_id"]
        app.cancel_job(job_id, reason=reason, actor=session["user"])
        logged(session, "cancel", f"job {job_id}", reason)
        return f"Job {job_id} cancelled."

    routes = [
        Route("/", index),
        Route("/tasks", tasks),
        Route("/tasks/{name:path}", task),
        Route("/jobs", jobs),
        Route("/jobs/{job_id:int}", job),
        Route("/health", health),
        Route("/audit", audit),
        Route("/login", login, methods=["GET"]),
        Route("/login", login_post, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/actions/trigger/{name:path}", action(trigger), methods=["POST"]),
        Route("/actions/enable/{name:path}", action(enable), methods=["POST"]),
        Route("/actions/disable/{name:path}", action(disable), methods=["POST"]),
        Route("/actions/retry/{job_id:int}", action(retry), methods=["POST"]),
        Route("/actions/cancel/{job_id:int}", action(cancel), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    metrics = _metrics_endpoint(app, dash.creds)
    if metrics is not None:
        routes.append(Route("/metrics", metrics))
    web = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)])
    web.state.dashboard = dash
    return web


def _metrics_endpoint(
    app: Scheduler, creds: tuple[str, str] | None
) -> Callable[[Request], Awaitable[Response]] | None:
    """``/metrics`` (Prometheus text) when ``scheduler[metrics]`` is installed, else None.

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
