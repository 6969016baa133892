"""The scheduler's tasks as a Django model, for Django's admin (``admin.py``) and your own
read-only queries: :class:`Task` is an *unmanaged* model over the scheduler's ``scheduler_rows``
table (``managed = False``: Django never creates, migrates or drops it; ``manage.py scheduler
migrate`` does). Read it freely; change tasks only through the scheduler's calls
(``put_task``, ``remove_task``, ``enable``, ``disable``), as the admin does: a ``save()`` or
``delete()`` on it — or a queryset's ``update()``, ``delete()``, ``bulk_create()`` or
``bulk_update()`` — would bypass the scheduler's checks, its audit and its rules, and is refused."""

from __future__ import annotations

from typing import Any

from django.db import models

_CHANGE = "scheduler tasks change through the scheduler: get_scheduler().put_task(...)"


class TaskQuerySet(models.QuerySet["Task"]):
    """Reads as any queryset; its writes in bulk are refused as ``Task.save()`` is (one
    ``UPDATE`` would skip the checks, the recomputed ``next_run_at``, the version a racing tick
    compares and the audit entry)."""

    def update(self, **kwargs: Any) -> int:
        raise TypeError(_CHANGE)

    def delete(self) -> Any:
        raise TypeError(
            "scheduler tasks are removed through the scheduler: get_scheduler().remove_task(...)"
        )

    def bulk_create(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_CHANGE)

    def bulk_update(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_CHANGE)

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(_CHANGE)


class Task(models.Model):
    """One row of ``scheduler_rows``: a task of the file (``source`` ``file``) or of the
    application (``api``)."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    source = models.CharField(max_length=8, default="api", editable=False)
    group = models.CharField("group", max_length=200, db_column="task_group", null=True, blank=True)
    tenant = models.CharField(max_length=63, null=True, blank=True)
    cron = models.CharField(max_length=200)
    timezone = models.CharField("zone", max_length=64, default="UTC")
    handler = models.CharField(max_length=200)
    payload = models.TextField(default="{}", help_text="A JSON object.")
    enabled = models.BooleanField(default=True)
    overlap = models.CharField(
        max_length=8,
        default="hold",
        choices=[("hold", "hold"), ("skip", "skip"), ("allow", "allow")],
        help_text="While the last job is in flight.",
    )
    catchup_window = models.IntegerField(default=0, help_text="Seconds; 0: unlimited.")
    jitter = models.IntegerField(default=0, help_text="Seconds; 0: none.")
    max_consecutive_failures = models.IntegerField(
        null=True, blank=True, help_text="Blank: the [scheduler] setting; 0: never disable."
    )
    next_run_at = models.DateTimeField(null=True, editable=False)
    consecutive_failures = models.IntegerField(default=0, editable=False)
    disabled_reason = models.CharField(max_length=64, null=True, editable=False)
    disabled_note = models.CharField(max_length=500, null=True, editable=False)

    objects = TaskQuerySet.as_manager()

    class Meta:
        managed = False
        db_table = "scheduler_rows"
        ordering = ("name",)
        verbose_name = "scheduled task"

    def __str__(self) -> str:
        return str(self.name)

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(_CHANGE)

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "scheduler tasks are removed through the scheduler: get_scheduler().remove_task(...)"
        )
