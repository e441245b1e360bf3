"""Which Celery app the scheduler publishes to and validates task names against."""

from __future__ import annotations

from functools import lru_cache

from celery import Celery, current_app
from celery.utils.imports import symbol_by_name

from . import conf


@lru_cache(maxsize=1)
def _configured_app(path: str) -> Celery:
    return symbol_by_name(path)


def get_app() -> Celery:
    """The Celery app: ``CRON_AT_SCALE["CELERY_APP"]`` ("module:attr") or ``celery.current_app``."""
    path = conf.get("CELERY_APP")
    return _configured_app(path) if path else current_app._get_current_object()


def is_registered(name: str) -> bool:
    """True if ``name`` is a task the Celery app knows (importing autodiscovered task modules once)."""
    app = get_app()
    if name in app.tasks:
        return True
    app.loader.import_default_modules()
    return name in app.tasks
