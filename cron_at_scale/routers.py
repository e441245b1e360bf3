"""The database router that puts the app on its own database: ``CRON_AT_SCALE["DATABASE"]``.

Add it to ``DATABASE_ROUTERS`` when that setting names another alias than ``"default"``::

    DATABASES = {"default": {...}, "jobs": {...}}
    DATABASE_ROUTERS = ["cron_at_scale.routers.CronAtScaleRouter"]
    CRON_AT_SCALE = {"DATABASE": "jobs"}

It sends every model of the app (app label ``cron_at_scale``) to that alias (inside
``conf.using(alias)``, to that one: a job's own database of ``SHARD_DATABASES``), reads and writes,
migrates the app there and on every alias of ``SHARD_DATABASES``, nowhere else, and has no opinion on other apps' models. The
package's own statements go to the alias without it (:func:`cron_at_scale.conf.db_alias`); the
router is for what Django does with the models: ``migrate``, the admin, the ORM in user code.
``manage.py check`` errors (``cron_at_scale.E006``) when the alias is not "default" and the
models are not routed there. It is not installed behind the user's back: ``DATABASE_ROUTERS`` is
the user's list, its order decides, and Django reads it once per process.
"""

from __future__ import annotations

from typing import Any

from cron_at_scale import conf

APP_LABEL = "cron_at_scale"


class CronAtScaleRouter:
    """Every model of ``cron_at_scale`` on ``CRON_AT_SCALE["DATABASE"]``; None for other apps (the
    next router, or ``default``, decides)."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return conf.db_alias() if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return conf.db_alias() if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        """True between two of the app's objects; None otherwise (a relation from another app's
        model to a job crosses databases: no foreign key can hold it)."""
        if obj1._meta.app_label == APP_LABEL and obj2._meta.app_label == APP_LABEL:
            return True
        return None

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        """The app's tables on its alias, and on every alias of ``SHARD_DATABASES``; None for other apps."""
        if app_label == APP_LABEL:
            return db == conf.get("DATABASE") or db in conf.shard_aliases()
        return None
