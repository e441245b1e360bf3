"""No pickle: a worker of an app set up with ``JobTask`` refuses to start if it would accept
pickled messages (scheduled messages are JSON only; :func:`cron_at_scale.celery_app.refuse_pickle`)."""

from __future__ import annotations

from typing import Any

from cron_at_scale.worker.middleware.base import Middleware


class RefusePickle(Middleware):
    def before_worker_boot(self, worker: Any) -> None:
        from cron_at_scale.celery_app import refuse_pickle

        app = getattr(worker, "app", None)
        # JobTask and its subclasses say so (a class attribute): no import of the task module here
        if app is not None and getattr(app.Task, "runs_scheduled_jobs", False) is True:
            refuse_pickle(app)
