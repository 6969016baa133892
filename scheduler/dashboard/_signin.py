"""Signing in and out: a form with the session's CSRF token; a new session id at each sign-in
(no fixation); a failed sign-in is logged."""

from __future__ import annotations

import logging
import secrets

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from ._auth import credentials_match
from ._state import Dashboard, root_path, safe_next

log = logging.getLogger(__name__)

STALE = "missing or stale CSRF token: reload the page"


def login(dash: Dashboard, request: Request) -> Response:
    target = safe_next(root_path(request), request.query_params.get("next"))
    return dash.render(request, "login.html", {"next": target, "error": None})


async def login_post(dash: Dashboard, request: Request) -> Response:
    form = await request.form()
    session = dash.session(request)
    target = safe_next(root_path(request), str(form.get("next") or ""))
    if not dash.signer.check_csrf(session["sid"], str(form.get("csrf") or "")) or session.get(
        "new"
    ):
        return Response(STALE, status_code=403)
    user, password = str(form.get("username") or ""), str(form.get("password") or "")
    if not credentials_match(dash.creds, user, password):
        log.warning("dashboard: failed sign-in", extra={"action": "dashboard_login_failed"})
        context = {"next": target, "error": "Wrong username or password.", "_session": session}
        return dash.render(request, "login.html", context, 401)
    fresh = {"sid": secrets.token_urlsafe(16), "user": user}  # a new id: no fixation
    response = RedirectResponse(target, status_code=303)
    dash.store_session(request, response, fresh)
    return response


async def logout(dash: Dashboard, request: Request) -> Response:
    form = await request.form()
    session = dash.session(request)
    if session.get("new") or not dash.signer.check_csrf(
        session["sid"], str(form.get("csrf") or "")
    ):
        return Response(STALE, status_code=403)
    response = RedirectResponse(root_path(request) + "/login", status_code=303)
    dash.store_session(request, response, {"sid": secrets.token_urlsafe(16), "user": None})
    return response


def routes(dash: Dashboard) -> list[Route]:
    async def post_login(request: Request) -> Response:
        return await login_post(dash, request)

    async def post_logout(request: Request) -> Response:
        return await logout(dash, request)

    return [
        Route("/login", lambda request: login(dash, request), methods=["GET"]),
        Route("/login", post_login, methods=["POST"]),
        Route("/logout", post_logout, methods=["POST"]),
    ]
