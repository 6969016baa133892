"""The Audit page: the newest entries, of one target (``?target=NAME`` or ``job ID``) if asked;
a target that names no task or job is a 404 that says so."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._errors import SchedulerError
from ._state import Dashboard, page

AUDIT_PAGE = 200  # entries on the Audit page, newest first


def audit(dash: Dashboard, request: Request) -> Response:
    target = request.query_params.get("target", "").strip()
    try:
        entries = dash.app.audit(target or None, limit=AUDIT_PAGE)
    except SchedulerError:  # no task or job of that name: say so, not "nothing yet"
        what = target if target.startswith("job ") else f"task {target!r}"
        return dash.render(request, "missing.html", {"what": what}, 404)
    return dash.render(request, "audit.html", {"entries": entries, "target": target})


def routes(dash: Dashboard) -> list[Route]:
    return [Route("/audit", page(dash, audit))]
