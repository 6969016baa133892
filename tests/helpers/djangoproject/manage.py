#!/usr/bin/env python
"""The test project's manage.py (tests/e2e/test_django.py runs it as users run theirs)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djangoproject.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
