"""A small Django project for tests/e2e/test_django.py: a shop whose orders enqueue a receipt job.

The database comes from ``SCHEDULER_TEST_DJANGO_URL`` (a SQLAlchemy URL of the test's own
database: a SQLite file, or PostgreSQL/MariaDB with the test session's schema or database).
"""

import os
from pathlib import Path

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
ROOT_URLCONF = "djangoproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "scheduler.contrib.django", "shop"]
MIDDLEWARE: list[str] = []

url = make_url(os.environ["SCHEDULER_TEST_DJANGO_URL"])
backend = url.get_backend_name()
if backend == "sqlite":
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": url.database}}
else:
    DATABASES = {
        "default": {
            "ENGINE": f"django.db.backends.{'postgresql' if backend == 'postgresql' else 'mysql'}",
            "NAME": url.database,
            "USER": url.username or "",
            "PASSWORD": url.password or "",
            "HOST": url.host or "",
            "PORT": str(url.port or ""),
            "OPTIONS": {"options": url.query["options"]} if "options" in url.query else {},
        }
    }
    if backend != "postgresql":  # Django's MySQL backend, on PyMySQL
        import pymysql

        pymysql.install_as_MySQLdb()

SCHEDULER = {
    "database": "default",
    "worker": {"imports": ["shop.jobs"], "concurrency": 2},
    "tasks": [{"name": "tidy", "cron": "0 4 * * *", "handler": "shop.tidy"}],
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
