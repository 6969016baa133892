"""The web dashboard (docs/howto/dashboard.md): ``pip install 'rerun-scheduler[dashboard]'``.

``create_app(app)`` returns an ASGI application to mount in a host application or to serve
with uvicorn (``scheduler dashboard`` does). Starlette and Jinja2 are imported only when it is
called, so ``scheduler`` itself keeps its small set of dependencies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._auth import hash_password, verify_password

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from .._app import Scheduler
    from .._config import DashboardSettings

__all__ = ["create_app", "hash_password", "verify_password"]


def create_app(
    app: Scheduler, settings: DashboardSettings | None = None, *, secret: bytes | None = None
) -> Starlette:
    """The dashboard of ``app`` as an ASGI application; see :mod:`scheduler.dashboard._web`."""
    try:
        from ._web import create_app as build
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            f"the dashboard needs its extra: pip install 'rerun-scheduler[dashboard]' ({exc})"
        ) from exc
    return build(app, settings, secret=secret)
