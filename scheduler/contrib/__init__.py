"""Integrations with frameworks, each behind its own extra (``rerun-scheduler[django]``)."""
