"""The actions: trigger, enable, disable (with a reason), retry, cancel. Each is a POST with
the session's CSRF token, by a signed-in user, only with ``[dashboard] actions = true``. The
change gets the user and the reason: its audit entry is written in its own transaction (a
refused action writes none), and it is logged here."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .._errors import SchedulerError
from ._state import Dashboard, root_path, safe_next

log = logging.getLogger(__name__)

#: An action: the change, from the request, the session and the reason; returns the message
#: the next page shows.
Action = Callable[[Dashboard, Request, dict[str, Any], str], str]


def endpoint(dash: Dashboard, run: Action) -> Callable[[Request], Awaitable[Response]]:
    """The POST endpoint of action ``run``: the checks, then the change in a thread, then back
    to the page the form came from with the message."""

    async def act(request: Request) -> Response:
        form = await request.form()
        session = dash.session(request)
        if not dash.settings.actions:
            return Response("actions are off ([dashboard] actions = false)", status_code=403)
        if not session.get("user") or session.get("new"):
            return Response("sign in to act", status_code=401)
        if not dash.signer.check_csrf(session["sid"], str(form.get("csrf") or "")):
            return Response("missing or stale CSRF token: reload the page", status_code=403)
        reason = str(form.get("reason") or "").strip()[:500]
        request.state.form = form  # for an action that reads more of it (a bulk's filter)
        try:
            message = await run_in_threadpool(run, dash, request, session, reason)
        except SchedulerError as exc:
            message = f"Refused: {exc}"
        target = safe_next(root_path(request), str(form.get("next") or ""))
        response = RedirectResponse(target, status_code=303)
        dash.store_session(request, response, {**session, "flash": message})
        return response

    act.__name__ = run.__name__
    return act


def logged(session: dict[str, Any], act: str, target: str, reason: str) -> None:
    log.info(
        "dashboard: %s %s by %s%s",
        act,
        target,
        session["user"],
        f" ({reason})" if reason else "",
        extra={"action": f"dashboard_{act}", "actor": session["user"], "target": target},
    )


def trigger(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    name = request.path_params["name"]
    dash.app.trigger(name, reason=reason, actor=session["user"])
    logged(session, "trigger", name, reason)
    return f"Triggered {name}: due now, the next tick dispatches it."


def enable(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    app, name = dash.app, request.path_params["name"]
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


def disable(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    name = request.path_params["name"]
    if not reason:
        raise SchedulerError("say why: a reason is needed to disable a task")
    dash.app.disable(name, reason=reason, actor=session["user"])
    logged(session, "disable", name, reason)
    return f"Disabled {name}: {reason}"


def retry(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    job_id = request.path_params["job_id"]
    dash.app.retry_job(job_id, reason=reason, actor=session["user"])
    logged(session, "retry", f"job {job_id}", reason)
    return f"Job {job_id} is queued again, attempts reset."


def cancel(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    job_id = request.path_params["job_id"]
    found = dash.app.cancel_job(job_id, reason=reason, actor=session["user"])
    logged(session, "cancel", f"job {job_id}", reason)
    if found.state == "claimed":
        return f"Job {job_id} is running: its worker stops it (aborted, code cancelled)."
    return f"Job {job_id} cancelled."


def routes(dash: Dashboard) -> list[Route]:
    post = ["POST"]
    return [
        Route("/actions/trigger/{name:path}", endpoint(dash, trigger), methods=post),
        Route("/actions/enable/{name:path}", endpoint(dash, enable), methods=post),
        Route("/actions/disable/{name:path}", endpoint(dash, disable), methods=post),
        Route("/actions/retry/{job_id:int}", endpoint(dash, retry), methods=post),
        Route("/actions/cancel/{job_id:int}", endpoint(dash, cancel), methods=post),
    ]
