"""What every page of the dashboard shares: :class:`Dashboard` (the app, the settings, the
session signer, the templates and the health cache) and the wrappers that make a page or an
action out of a function of ``(dash, request)``. The pages themselves are in ``_page_*.py``,
the sign-in in ``_signin.py``, the actions in ``_actions.py``; ``_web.py`` assembles them."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from .._config import DashboardSettings
from .._errors import ConfigError
from .._model.rules import STATES
from .._store.status import health as _health
from ._auth import Signer, credentials
from ._counts import FinishedCounts
from ._render import _ago, _environment, _pill, _strip, _when

if TYPE_CHECKING:
    from .._app import Scheduler

COOKIE = "scheduler_dashboard"
LIVE_HEADER = "x-dashboard-live"
LIVE_START, LIVE_END = "<!--live-->", "<!--/live-->"  # base.html's live region

#: A page: a function of the dashboard and the request.
Page = Callable[["Dashboard", Request], Response]


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
                stores = [shard.store for shard in app.shards]  # [database] shards: each
                data = _health.overview(stores, app.clock(), app.health_settings())
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


def safe_next(base: str, target: str | None) -> str:
    """Only a path inside the dashboard: never another site (no open redirect)."""
    if (
        target
        and target.startswith(base + "/")
        and not target.startswith("//")
        and "\\" not in target
    ):
        return target
    return base + "/tasks"


def page(dash: Dashboard, fn: Page) -> Callable[[Request], Response]:
    """The endpoint of page ``fn``: with credentials configured, only for a signed-in user."""

    def endpoint(request: Request) -> Response:
        return dash.guard(request) or fn(dash, request)

    endpoint.__name__ = fn.__name__
    return endpoint


def root_path(request: Request) -> str:
    """Where the dashboard is mounted ("" at the root)."""
    return str(request.scope.get("root_path") or "")
