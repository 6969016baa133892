"""The scheduler's tasks in Django's admin (with ``django.contrib.admin`` installed).

The list has every task, searchable by name and filtered by source, group and tenant. The
application's tasks (``source`` ``api``) are added, changed, deleted, paused and resumed
through the scheduler's own calls (``put_task``, ``remove_task``, ``disable``, ``enable``) as
the signed-in user: the same checks and messages (an error beside the field its key names),
the same rules, an audit entry per change. Django never writes the table itself. A task of the
file is read-only here: ``scheduler sync`` owns it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from ..._errors import SchedulerError
from ..._model.rows import TaskSpec, unformed
from . import get_scheduler
from .models import Task

_KEY = re.compile(r"key '(\w+)'")
_FIELDS = (
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


class TaskForm(forms.ModelForm):
    """The fields of a task; its ``clean`` is ``put_task(..., dry_run=True)``'s check."""

    class Meta:
        model = Task
        fields = list(_FIELDS)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        name = self.instance.name if self.instance.pk else data.get("name", "")
        try:
            payload = json.loads(data.get("payload") or "{}")
        except ValueError as exc:
            self.add_error("payload", f"task {name!r}: key 'payload': not JSON: {exc}")
            return data
        if not isinstance(payload, dict):
            self.add_error("payload", f"task {name!r}: key 'payload': expected a JSON object")
            return data
        app = get_scheduler()
        found = app.get_row(name)
        if not self.instance.pk and found is not None and found.source == "api":
            self.add_error("name", f"task {name!r} exists: change it instead")
            return data
        # What the form has no field for is kept from the row it changes.
        kept = found if self.instance.pk and found is not None else None
        self.spec = TaskSpec(
            name=name,
            cron=data["cron"],
            handler=data["handler"],
            payload=payload,
            timezone=data.get("timezone") or None,
            enabled=bool(data.get("enabled")),
            overlap=data.get("overlap") or "hold",
            catchup_window=data.get("catchup_window") or 0,
            jitter=data.get("jitter") or 0,
            max_consecutive_failures=data.get("max_consecutive_failures"),
            tenant=data.get("tenant") or None,
            group=data.get("group") or None,
            **unformed(kept),
        )
        try:
            app.put_task(self.spec, dry_run=True)
        except SchedulerError as exc:
            found_key = _KEY.search(str(exc))
            key = found_key.group(1) if found_key else "name"
            self.add_error(key if key in _FIELDS else None, str(exc))
        return data

    def _post_clean(self) -> None:
        pass  # no model validation: put_task's checks (in clean) are the rules

    def save(self, commit: bool = True) -> Any:
        return self.instance


class _ValueFilter(admin.SimpleListFilter):
    """A filter by one column's value that lists at most :attr:`SHOWN` values (the first by
    order, through the column's index: no DISTINCT over a million rows on every page); any
    other value still filters from the address (``?group=customer-42``)."""

    SHOWN = 50

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        column = self.parameter_name
        found = list(
            model_admin.get_queryset(request)
            .exclude(**{f"{column}__isnull": True})
            .order_by(column)
            .values_list(column, flat=True)
            .distinct()[: self.SHOWN]
        )
        chosen = self.value()
        if chosen and chosen not in found:
            found.append(chosen)
        return [(value, value) for value in found]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> QuerySet[Task]:
        chosen = self.value()
        return queryset.filter(**{self.parameter_name: chosen}) if chosen else queryset


class _GroupFilter(_ValueFilter):
    title = "group"
    parameter_name = "group"


class _TenantFilter(_ValueFilter):
    title = "tenant"
    parameter_name = "tenant"


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    form = TaskForm
    list_display = (
        "name",
        "source",
        "group",
        "tenant",
        "cron",
        "timezone",
        "handler",
        "enabled",
        "next_run_at",
        "consecutive_failures",
    )
    list_filter = ("source", _GroupFilter, _TenantFilter, "enabled")
    search_fields = ("name",)
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) of a million rows on every page
    actions = ("pause_tasks", "resume_tasks")
    readonly_fields = (
        "source",
        "next_run_at",
        "consecutive_failures",
        "disabled_reason",
        "disabled_note",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Task]:
        return super().get_queryset(request).using(get_scheduler().django_alias)

    def get_readonly_fields(self, request: HttpRequest, obj: Task | None = None) -> Any:
        if obj is not None:
            return ("name", *self.readonly_fields)
        return self.readonly_fields

    def has_change_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        if obj is not None and obj.source != "api":
            return False  # the file's: read-only here
        return bool(super().has_change_permission(request, obj))

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        if obj is not None and obj.source != "api":
            return False
        return bool(super().has_delete_permission(request, obj))

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        task = self.get_object(request, object_id)
        if task is not None and task.source != "api" and request.method == "GET":
            self.message_user(
                request,
                f"{task.name} is managed by {get_scheduler()._owner()}: change it there and run"
                " `manage.py scheduler sync`.",
                messages.INFO,
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def save_model(self, request: HttpRequest, obj: Task, form: Any, change: bool) -> None:
        app = get_scheduler()
        app.put_task(form.spec, actor=_actor(request), reason="Django admin")
        row = self.get_queryset(request).values_list("pk", flat=True).get(name=form.spec.name)
        obj.pk = row  # for the admin's log entry and its redirect

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: Any) -> None:
        pass

    def delete_model(self, request: HttpRequest, obj: Task) -> None:
        get_scheduler().remove_task(obj.name, actor=_actor(request), reason="Django admin")

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        app, skipped = get_scheduler(), []
        for task in queryset:
            if task.source != "api":
                skipped.append(task.name)
                continue
            app.remove_task(task.name, actor=_actor(request), reason="Django admin")
        if skipped:
            self.message_user(
                request,
                f"Not deleted, managed by {app._owner()}: {', '.join(skipped)}",
                messages.WARNING,
            )

    @admin.action(description="Pause the selected tasks (the application's)")  # type: ignore[untyped-decorator]
    def pause_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        self._each(
            request,
            queryset,
            "paused",
            lambda app, name, who: app.disable(
                name, reason="paused in the Django admin", actor=who
            ),
        )

    @admin.action(description="Resume the selected tasks (the application's)")  # type: ignore[untyped-decorator]
    def resume_tasks(self, request: HttpRequest, queryset: QuerySet[Task]) -> None:
        self._each(
            request,
            queryset,
            "resumed",
            lambda app, name, who: app.enable(
                name, reason="resumed in the Django admin", actor=who
            ),
        )

    def _each(self, request: HttpRequest, queryset: QuerySet[Task], done: str, act: Any) -> None:
        app, changed, skipped = get_scheduler(), [], []
        for task in queryset:
            if task.source != "api":
                skipped.append(task.name)
                continue
            act(app, task.name, _actor(request))
            changed.append(task.name)
        if changed:
            self.message_user(request, f"{done.capitalize()}: {', '.join(changed)}")
        if skipped:
            self.message_user(
                request,
                f"Not {done}, managed by {app._owner()}: {', '.join(skipped)}",
                messages.WARNING,
            )


def _actor(request: HttpRequest) -> str:
    user = getattr(request, "user", None)
    return str(user.get_username()) if user is not None else "django-admin"
