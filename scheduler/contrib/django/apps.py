"""The Django application: add ``"scheduler.contrib.django"`` to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig


class SchedulerConfig(AppConfig):
    name = "scheduler.contrib.django"
    label = "scheduler"
    verbose_name = "scheduler"
