"""The Tasks page (a filtered, paged list with each task's run strip) and the Task page (what
``scheduler explain`` prints); ``/`` leads to the first."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .._store.rows import SOURCES
from .._store.status import dashboard as _queries
from .._store.status import shards as _shards
from . import _views
from ._state import Dashboard, page, root_path


def index(dash: Dashboard, request: Request) -> Response:
    return RedirectResponse(root_path(request) + "/tasks", status_code=303)


def tasks(dash: Dashboard, request: Request) -> Response:
    app, p = dash.app, request.query_params
    name, state = p.get("name", "").strip(), p.get("state", "")
    state = state if state in _queries.TASK_STATES else ""
    narrow = {key: p.get(key, "").strip() for key in ("prefix", "group", "tenant", "source")}
    if narrow["source"] not in SOURCES:
        narrow["source"] = ""
    now = app.clock()
    pages, strips = [], {}
    for shard in app.shards:  # [database] shards: each shard's page, merged by name
        with shard.store.read() as conn:
            one = _queries.tasks(
                conn,
                name=name,
                state=state,
                after=p.get("after") or None,
                now=now,
                prefix=narrow["prefix"],
                group=narrow["group"],
                tenant=narrow["tenant"],
                source=narrow["source"],
            )
            strips.update(_queries.strips(conn, [t["name"] for t in one.items]))
        pages.append(one)
    found = pages[0] if len(pages) == 1 else _shards.page(pages, "name", _queries.PAGE_SIZE)
    query = {k: v for k, v in (("name", name), ("state", state), *narrow.items()) if v}
    return dash.render(
        request,
        "tasks.html",
        {
            "tasks": found.items,
            "strips": strips,
            "filters": {"name": name, "state": state, **narrow},
            "sources": SOURCES,
            "owner": dash.app._owner(),
            "task_states": _queries.TASK_STATES,
            "next_page": urlencode({**query, "after": found.next_cursor})
            if found.next_cursor is not None
            else None,
            "first_page": urlencode(query) if p.get("after") else None,
        },
    )


def task(dash: Dashboard, request: Request) -> Response:
    name = request.path_params["name"]
    app = dash.app._task_shard(name) if dash.app.sharded else dash.app  # the task's shard
    data = _views.task_page(app, name, dash.app.clock())
    if data is None:
        return dash.render(request, "missing.html", {"what": f"task {name!r}"}, 404)
    return dash.render(request, "task.html", {**data, "owner": dash.app._owner()})


def routes(dash: Dashboard) -> list[Route]:
    return [
        Route("/", page(dash, index)),
        Route("/tasks", page(dash, tasks)),
        Route("/tasks/{name:path}", page(dash, task)),
    ]
