"""Integrations with frameworks, each behind its own extra (``scheduler[django]``)."""
