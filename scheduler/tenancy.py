"""PostgreSQL schema-per-tenant: every run's queries go to its tenant's schema.

``SchemaPerTenant`` and ``TenantSchemaMissing``; the implementation, which talks to your
database with SQLAlchemy and psycopg, is ``scheduler/contrib/tenancy.py``
(docs/howto/async-handlers-and-tenants.md shows it in use).
"""

from __future__ import annotations

from .contrib.tenancy import SchemaPerTenant, TenantSchemaMissing, quote

__all__ = ["SchemaPerTenant", "TenantSchemaMissing", "quote"]
