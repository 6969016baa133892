"""The Jobs page (filtered by state, task, handler, queue; paged by id) and the Job page (its
attempts, numbered by run)."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._model.rules import STATES
from .._store.jobs import get_job, history
from .._store.status import dashboard as _queries
from .._store.status import shards as _shards
from ._state import Dashboard, page


def jobs(dash: Dashboard, request: Request) -> Response:
    p = request.query_params
    filters = {k: p.get(k, "").strip() for k in ("state", "task", "handler", "queue")}
    if filters["state"] not in STATES:
        filters["state"] = ""
    before = p.get("before", "")
    pages = []
    for shard in dash.app.shards:  # [database] shards: each shard's page, merged by id
        with shard.store.read() as conn:
            pages.append(
                _queries.job_list(
                    conn,
                    state=filters["state"],
                    task=filters["task"],
                    handler=filters["handler"],
                    queue=filters["queue"],
                    before=int(before) if before.isdigit() else None,
                )
            )
    found = (
        pages[0]
        if len(pages) == 1
        else _shards.page(pages, "id", _queries.PAGE_SIZE, newest_first=True)
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


def job(dash: Dashboard, request: Request) -> Response:
    job_id = request.path_params["job_id"]
    shard = dash.app._job_shard(job_id) if dash.app.sharded else dash.app  # the job's shard
    with shard.store.read() as conn:
        found = get_job(conn, job_id)
        if found is not None:  # a ready job a limit holds back says what it waits for
            found = shard.with_waiting(conn, [found])[0]
        runs = history(conn, job_id) if found is not None else []
        zone = _queries.task_timezone(conn, found.task_name) if found is not None else None
    if found is None:
        return dash.render(request, "missing.html", {"what": f"job {job_id}"}, 404)
    # A task's job carries the payload its TOML entry gave; of any other job only the keys
    # are shown: their values came from application code, not from this user.
    return dash.render(request, "job.html", {"job": found, "runs": runs, "zone": zone or "UTC"})


def routes(dash: Dashboard) -> list[Route]:
    return [Route("/jobs", page(dash, jobs)), Route("/jobs/{job_id:int}", page(dash, job))]
