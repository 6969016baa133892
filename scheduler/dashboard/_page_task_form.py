"""The New task and Edit forms for the application's tasks (``source`` ``api``), their preview
and Remove.

Each form is a POST with the session's CSRF token, by a signed-in user, only with
``[dashboard] actions = true``, as the actions are (``_actions.py``). The form calls
``put_task`` (and Remove ``remove_task``) with the user as the actor, so the checks, the
messages and the audit entry are the API's: a ``ConfigError`` names the key, and the form shows
it beside that field. The preview is ``put_task(..., dry_run=True)``'s next fires, in the task's
zone and in UTC, a change of the zone's offset marked; the page's script asks for it as the
fields change (``POST /task-preview``, an HTML fragment), and without a script the Preview
button renders the whole form with it. A task of the file is never edited here: its page says
which file manages it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from .._errors import ConfigError, SchedulerError
from .._model.rows import TaskChange, TaskRow, TaskSpec, unformed
from .._model.slots import utc_offset
from .._model.time import in_zone, offset_in
from . import _actions
from ._state import Dashboard, page, root_path

FIELDS = (
    "name",
    "cron",
    "timezone",
    "handler",
    "payload",
    "tenant",
    "group",
    "overlap",
    "catchup_window",
    "jitter",
    "max_consecutive_failures",
    "enabled",
)
OVERLAPS = ("hold", "skip", "allow", "replace")
_KEY = re.compile(r"key '(\w+)'")


def _values_of(row: TaskRow | None, timezone: str) -> dict[str, str]:
    """The form's fields as text: a row's, or a new task's defaults."""
    if row is None:
        return {
            "name": "",
            "cron": "",
            "timezone": timezone,
            "handler": "",
            "payload": "{}",
            "tenant": "",
            "group": "",
            "overlap": "hold",
            "catchup_window": "0",
            "jitter": "0",
            "max_consecutive_failures": "",
            "enabled": "on",
        }
    limit = row.max_consecutive_failures
    return {
        "name": row.name,
        "cron": row.cron,
        "timezone": row.timezone,
        "handler": row.handler,
        "payload": json.dumps(row.payload, sort_keys=True),
        "tenant": row.tenant or "",
        "group": row.group or "",
        "overlap": row.overlap,
        "catchup_window": str(row.catchup_window),
        "jitter": str(row.jitter),
        "max_consecutive_failures": "" if limit is None else str(limit),
        "enabled": "on" if row.enabled else "",
    }


def _form_values(form: Any, name: str | None) -> dict[str, str]:
    values = {key: str(form.get(key) or "").strip() for key in FIELDS}
    values["payload"] = str(form.get("payload") or "").strip() or "{}"
    if name is not None:
        values["name"] = name  # an edit keeps its name: the path says which task
    return values


def _spec(values: dict[str, str]) -> TaskSpec:
    """The spec the fields describe; a field that is not even the right type is a
    ``ConfigError`` naming the task and the key, as ``put_task``'s own are."""
    name = values["name"]
    if not name:
        raise ConfigError("task '': key 'name': a task needs a name")

    def number(key: str, blank: int | None) -> int | None:
        text = values[key]
        if not text:
            return blank
        try:
            return int(text)
        except ValueError:
            message = f"task {name!r}: key {key!r}: expected a whole number, got {text!r}"
            raise ConfigError(message) from None

    try:
        payload = json.loads(values["payload"])
    except ValueError as exc:
        raise ConfigError(f"task {name!r}: key 'payload': not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ConfigError(f"task {name!r}: key 'payload': expected a JSON object")
    return TaskSpec(
        name=name,
        cron=values["cron"],
        handler=values["handler"],
        payload=payload,
        timezone=values["timezone"] or None,
        enabled=values["enabled"] == "on",
        overlap=values["overlap"] or "hold",
        catchup_window=number("catchup_window", 0) or 0,
        jitter=number("jitter", 0) or 0,
        max_consecutive_failures=number("max_consecutive_failures", None),
        tenant=values["tenant"] or None,
        group=values["group"] or None,
    )


def _field_of(message: str) -> str:
    """The field an error concerns: its ``key '...'``, else the name (a file's task, ...)."""
    found = _KEY.search(message)
    key = found.group(1) if found else "name"
    return key if key in FIELDS else "name"


def _fires(change: TaskChange, zone: str, now: datetime) -> list[dict[str, Any]]:
    """The change's next fires after it, each with the zone's offset change before it."""
    tz = ZoneInfo(zone)
    previous = offset_in(tz, now)
    found = []
    for at in change.fires_after:
        offset = offset_in(tz, at)
        shift = None if offset == previous else f"{utc_offset(previous)} → {utc_offset(offset)}"
        found.append({"at": at, "local": in_zone(at, tz), "dst": shift})
        previous = offset
    return found


class Outcome:
    """What a put (or its preview) gave: the change, or the error and its field."""

    def __init__(self) -> None:
        self.change: TaskChange | None = None
        self.zone = "UTC"
        self.errors: dict[str, str] = {}


def _put(
    dash: Dashboard,
    values: dict[str, str],
    user: str,
    reason: str,
    dry_run: bool,
    creating: bool,
) -> Outcome:
    outcome = Outcome()
    try:
        spec = _spec(values)
        outcome.zone = spec.timezone or dash.app.settings.timezone
        found = dash.app.get_row(spec.name)
        if creating and found is not None and found.source == "api":  # a file's: put_task says
            raise SchedulerError(f"task {spec.name!r} exists: edit it instead")
        if not creating and found is not None:  # the form has no field for these: kept
            spec = dataclasses.replace(spec, **unformed(found))
        outcome.change = dash.app.put_task(spec, dry_run=dry_run, reason=reason or None, actor=user)
    except SchedulerError as exc:
        outcome.errors[_field_of(str(exc))] = str(exc)
    return outcome


def _allowed(dash: Dashboard, session: dict[str, Any], form: Any) -> Response | None:
    """The actions' checks (``_actions.endpoint``): actions on, signed in, a good CSRF token."""
    if not dash.settings.actions:
        return Response("actions are off ([dashboard] actions = false)", status_code=403)
    if not session.get("user") or session.get("new"):
        return Response("sign in to act", status_code=401)
    if not dash.signer.check_csrf(session["sid"], str(form.get("csrf") or "")):
        return Response("missing or stale CSRF token: reload the page", status_code=403)
    return None


def _render_form(
    dash: Dashboard,
    request: Request,
    row: TaskRow | None,
    values: dict[str, str],
    outcome: Outcome | None = None,
    status: int = 200,
) -> Response:
    return dash.render(
        request,
        "task_form.html",
        {
            "editing": row,
            "values": values,
            "overlaps": OVERLAPS,
            "errors": outcome.errors if outcome else {},
            "preview": _preview_context(dash, outcome),
            "reason": "",
        },
        status,
    )


def _preview_context(dash: Dashboard, outcome: Outcome | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    change = outcome.change
    return {
        "zone": outcome.zone,
        "action": change.action if change else None,
        "changed": change.changed if change else (),
        "fires": _fires(change, outcome.zone, dash.app.clock()) if change else [],
        "errors": outcome.errors,
    }


def _editable(dash: Dashboard, name: str) -> TaskRow | Response:
    row = dash.app.get_row(name)
    if row is None:
        return Response(f"no task {name!r}", status_code=404)
    if row.source != "api":
        return Response(
            f"task {name!r} is managed by {dash.app._owner()}: edit it there", status_code=403
        )
    return row


def new_form(dash: Dashboard, request: Request) -> Response:
    if not dash.can_act(dash.session(request)):
        return Response("sign in, with [dashboard] actions = true, to add a task", 403)
    return _render_form(dash, request, None, _values_of(None, dash.app.settings.timezone))


def edit_form(dash: Dashboard, request: Request) -> Response:
    if not dash.can_act(dash.session(request)):
        return Response("sign in, with [dashboard] actions = true, to edit a task", 403)
    found = _editable(dash, request.path_params["name"])
    if isinstance(found, Response):
        return found
    return _render_form(dash, request, found, _values_of(found, found.timezone))


def submit(dash: Dashboard, editing: bool) -> Callable[[Request], Awaitable[Response]]:
    """The form's POST: Preview renders the form again with the fires; Save puts the task and
    goes to its page, or renders the form with the error beside its field (status 400)."""

    async def post(request: Request) -> Response:
        form = await request.form()
        session = dash.session(request)
        refused = _allowed(dash, session, form)
        if refused is not None:
            return refused
        row: TaskRow | None = None
        name = request.path_params.get("name") if editing else None
        if name is not None:
            found = await run_in_threadpool(_editable, dash, name)
            if isinstance(found, Response):
                return found
            row = found
        values = _form_values(form, name)
        reason = str(form.get("reason") or "").strip()[:500]
        dry_run = form.get("op") == "preview"
        outcome = await run_in_threadpool(
            _put, dash, values, session["user"], reason, dry_run, not editing
        )
        if outcome.errors or dry_run:
            status = 400 if outcome.errors else 200
            return _render_form(dash, request, row, values, outcome, status)
        change = outcome.change
        assert change is not None
        _actions.logged(session, "put_task", values["name"], reason)
        what = f": {', '.join(change.changed)}" if change.changed else ""
        message = f"{values['name']} {change.action}{what}."
        target = f"{root_path(request)}/tasks/{quote(values['name'], safe='')}"
        response = RedirectResponse(target, status_code=303)
        dash.store_session(request, response, {**session, "flash": message})
        return response

    post.__name__ = "edit_task" if editing else "new_task"
    return post


def preview(dash: Dashboard) -> Callable[[Request], Awaitable[Response]]:
    """``POST /task-preview``: the form's fields in, the preview fragment out (a dry run)."""

    async def post(request: Request) -> Response:
        form = await request.form()
        session = dash.session(request)
        refused = _allowed(dash, session, form)
        if refused is not None:
            return refused
        name = str(form.get("edit") or "") or None
        values = _form_values(form, name)
        outcome = await run_in_threadpool(
            _put, dash, values, session["user"], "", True, name is None
        )
        return dash.render(
            request,
            "_task_preview.html",
            {"preview": _preview_context(dash, outcome), "_session": session},
            400 if outcome.errors else 200,
        )

    return post


def remove(dash: Dashboard, request: Request, session: dict[str, Any], reason: str) -> str:
    name = request.path_params["name"]
    if not dash.app.remove_task(name, reason=reason or None, actor=session["user"]):
        raise SchedulerError(f"no task {name!r}")
    _actions.logged(session, "remove_task", name, reason)
    return f"Removed {name}: no slot of it runs from now on; its history stays."


def routes(dash: Dashboard) -> list[Route]:
    post = ["POST"]
    return [
        Route("/task-new", page(dash, new_form)),
        Route("/task-new", submit(dash, editing=False), methods=post),
        Route("/task-preview", preview(dash), methods=post),
        Route("/task-edit/{name:path}", page(dash, edit_form)),
        Route("/task-edit/{name:path}", submit(dash, editing=True), methods=post),
        Route("/actions/remove/{name:path}", _actions.endpoint(dash, remove), methods=post),
    ]
