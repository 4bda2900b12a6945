"""The local web app of ``ftplan serve``: a job form, plan charts and a JSON API under ``/api/``.

Nothing is imported or loaded here: ``create_app()`` imports FastAPI (the ``web`` extra) when
it is called, and catalogs are read on the first request that needs them.
"""

from __future__ import annotations

__all__ = ["create_app"]


def create_app(**kwargs):
    """Build the FastAPI app (see :func:`ftplan.web.app.create_app`)."""
    from .app import create_app as _create_app

    return _create_app(**kwargs)
