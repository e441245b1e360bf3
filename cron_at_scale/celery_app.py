"""The Celery app: which one the scheduler publishes to and validates task names against, and the
policy every process that uses it applies at start (scheduled messages are JSON, never pickle)."""

from __future__ import annotations

from functools import lru_cache

from celery import Celery
from celery.app import app_or_default
from celery.utils.imports import symbol_by_name

from cron_at_scale import conf


@lru_cache(maxsize=1)
def _configured_app(path: str) -> Celery:
    return symbol_by_name(path)


def get_app() -> Celery:
    """The Celery app: ``CRON_AT_SCALE["CELERY_APP"]`` ("module:attr") or ``celery.current_app``."""
    path = conf.get("CELERY_APP")
    return _configured_app(path) if path else app_or_default()


def is_registered(name: str) -> bool:
    """True if ``name`` is a task the Celery app knows (importing autodiscovered task modules once)."""
    app = get_app()
    if name in app.tasks:
        return True
    app.loader.import_default_modules()
    return name in app.tasks


def pickle_problems(app) -> list[str]:
    """Celery settings of ``app`` that admit pickle (empty when none)."""
    out = []
    for name in ("task_serializer", "result_serializer", "event_serializer"):
        if str(app.conf.get(name) or "").lower() == "pickle":
            out.append(f"{name} is 'pickle'")
    for name in ("accept_content", "result_accept_content"):
        accepted = app.conf.get(name) or []
        if any("pickle" in str(c).lower() for c in accepted):
            out.append(f"{name} admits pickle ({list(accepted)})")
    return out


def refuse_pickle(app) -> None:
    """Raise ``ImproperlyConfigured`` if ``app`` would accept pickled messages (workers and dispatchers
    call this at start: scheduled messages are JSON only)."""
    from django.core.exceptions import ImproperlyConfigured

    found = pickle_problems(app)
    if found:
        raise ImproperlyConfigured("cron_at_scale refuses to run with pickle: " + "; ".join(found)
                                   + ". Set CELERY_TASK_SERIALIZER = 'json' and CELERY_ACCEPT_CONTENT = ['json'].")
