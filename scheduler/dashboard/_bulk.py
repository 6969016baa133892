"""Bulk actions on the Jobs page: retry every aborted job, or cancel every queued job, that
the page's filter selects. A GET shows the count to confirm; the POST (CSRF, signed-in user,
``[dashboard] actions = true``, as every action) selects the jobs again, at most
:data:`BULK_LIMIT`, newest first, and changes them :data:`BULK_CHUNK` per transaction, each
job audited as the single action audits it (same action, actor and reason)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._errors import JobStateError
from .._model.rules import ABORTED, QUEUED
from .._store.status import present as _present
from ._actions import endpoint, logged
from ._state import Dashboard, page

if TYPE_CHECKING:
    from .._app import Scheduler

BULK_LIMIT = 1000
BULK_CHUNK = 100
#: Each bulk action and the state a job must be in for it.
BULK_STATES = {"retry": ABORTED, "cancel": QUEUED}
FILTERS = ("state", "task", "handler", "queue")


def _filters(source: Any) -> dict[str, str]:
    return {k: str(source.get(k) or "").strip() for k in FILTERS}


def _selected(
    dash: Dashboard, action: str, filters: dict[str, str], upto: int | None = None
) -> list[int]:
    """The jobs the action would change: in its state, matching the filter (a filter on
    another state selects none), none newer than ``upto``, newest first, at most one more
    than the cap."""
    return [job_id for job_id, _shard in _matching(dash, action, filters, upto)]


def _matching(
    dash: Dashboard, action: str, filters: dict[str, str], upto: int | None = None
) -> list[tuple[int, int]]:
    """:func:`_selected`'s jobs, each with the index of the shard that holds it."""
    state = BULK_STATES[action]
    if filters["state"] and filters["state"] != state:
        return []
    found: list[tuple[int, int]] = []
    for index, shard in enumerate(dash.app.shards):  # [database] shards: every shard's
        with shard.store.read() as conn:
            found.extend(
                (job_id, index)
                for job_id in _present.matching_ids(
                    conn,
                    state=state,
                    task=filters["task"],
                    handler=filters["handler"],
                    queue=filters["queue"],
                    upto=upto,
                    limit=BULK_LIMIT + 1,
                )
            )
    return sorted(found, reverse=True)[: BULK_LIMIT + 1]


def _described(action: str, filters: dict[str, str]) -> str:
    parts = [f"{k} {v}" for k, v in filters.items() if v and k != "state"]
    what = "aborted" if action == "retry" else "queued"
    return f"every {what} job" + (f" with {', '.join(parts)}" if parts else "")


def confirm(dash: Dashboard, request: Request) -> Response:
    action = request.path_params["action"]
    if action not in BULK_STATES:
        return dash.render(request, "missing.html", {"what": f"bulk action {action}"}, 404)
    filters = _filters(request.query_params)
    ids = _selected(dash, action, filters)
    count = len(ids)
    query = {k: v for k, v in filters.items() if v}
    return dash.render(
        request,
        "bulk.html",
        {
            "action": action,
            "filters": filters,
            "count": min(count, BULK_LIMIT),
            "over": count > BULK_LIMIT,
            # The POST changes none newer than the newest job counted here.
            "upto": ids[0] if ids else 0,
            "limit": BULK_LIMIT,
            "chunk": BULK_CHUNK,
            "described": _described(action, filters),
            "back": f"{dash_base(request)}/jobs" + (f"?{urlencode(query)}" if query else ""),
        },
    )


def dash_base(request: Request) -> str:
    return str(request.scope.get("root_path") or "")


def bulk(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    action = request.path_params["action"]
    if action not in BULK_STATES:
        return f"Refused: no bulk action {action!r}"
    form = request.state.form
    filters = _filters(form)
    upto = str(form.get("upto") or "")
    if not upto.isdigit():
        return "Refused: the confirmation is missing: start again from the Jobs page."
    chosen = _matching(dash, action, filters, int(upto))[:BULK_LIMIT]
    ids = [job_id for job_id, _shard in chosen]
    why = reason or f"bulk {action}: {_described(action, filters)}"[:500]
    done = skipped = 0
    for shard, held in _by_shard(dash, chosen):
        change = shard.retry_job if action == "retry" else shard.cancel_job
        for start in range(0, len(held), BULK_CHUNK):
            with shard.store.begin() as conn:  # one transaction per chunk, audits included
                for job_id in held[start : start + BULK_CHUNK]:
                    try:
                        change(job_id, reason=why, actor=session["user"], connection=conn)
                        done += 1
                    except JobStateError:  # changed since it was selected: left as it is
                        skipped += 1
    logged(session, f"bulk_{action}", f"{done} job(s)", why)
    verb = "Retried" if action == "retry" else "Cancelled"
    message = f"{verb} {done} job(s)"
    if skipped:
        message += f"; {skipped} had changed state meanwhile and were left alone"
    if len(ids) == BULK_LIMIT:
        message += f" (at most {BULK_LIMIT} at a time: run it again for the rest)"
    return message + "."


def _by_shard(dash: Dashboard, chosen: list[tuple[int, int]]) -> list[tuple[Scheduler, list[int]]]:
    """The jobs chosen (newest first) by the shard that holds each: a chunk's transaction is
    one shard's (with one shard, the app's own)."""
    held: dict[int, list[int]] = {}
    for job_id, index in chosen:
        held.setdefault(index, []).append(job_id)
    return [(dash.app.shards[index], chosen) for index, chosen in sorted(held.items())]


def routes(dash: Dashboard) -> list[Route]:
    return [
        Route("/jobs/bulk/{action}", page(dash, confirm)),
        Route("/actions/bulk/{action}", endpoint(dash, bulk), methods=["POST"]),
    ]
