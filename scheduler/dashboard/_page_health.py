"""The Workers & health page: ``status``'s data (:meth:`Dashboard.status`, cached for every
viewer) and the finished jobs' counts, taken in the background."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._model.rules import Thresholds
from .._store.status import counts as _counts
from ._state import Dashboard, page


def health(dash: Dashboard, request: Request) -> Response:
    context = {
        "status": dash.status(),
        "finished": dash.finished.get(),  # never waits: the last counts, with their age
        "finished_every": dash.finished.interval(),
        "finished_states": _counts.FINISHED,
        "worker_gone": f"{Thresholds.worker_gone:g}",
    }
    return dash.render(request, "health.html", context)


def routes(dash: Dashboard) -> list[Route]:
    return [Route("/health", page(dash, health))]
